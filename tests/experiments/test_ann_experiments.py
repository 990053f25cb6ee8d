"""ann_recall and ann_indexing_time end to end on tiny random data (no network, seconds)."""

import warnings

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf, open_dict

pytest.importorskip("faiss")

from experiments import ann_recall  # noqa: E402
from experiments.io import ResultStore  # noqa: E402
from run import REPO_ROOT  # noqa: E402

SPHERE = {"name": "random_sphere", "loader": "random_sphere", "label": "uniform random unit vectors (32-d)",
          "substitution": None, "dim": 32, "lift_dim": None, "n_base": 600, "n_queries": 40}


def _config(experiment: str, overrides=()):
    with initialize_config_dir(config_dir=str(REPO_ROOT / "configs"), version_base=None):
        cfg = compose("config", overrides=[f"experiment={experiment}", *overrides])
    return cfg


def _tiny_recall_config(tmp_path):
    cfg = _config("ann_recall", ["experiment.methods=[turboquant_mse,turboquant_prod,pq,rabitq]", "experiment.k_max=8"])
    with open_dict(cfg):
        cfg.experiment.datasets = OmegaConf.create({"sphere": SPHERE})
        cfg.experiment.sizes.quick = OmegaConf.create({"sphere": {"n_base": 600, "n_queries": 40}})
        cfg.paths.results_dir = str(tmp_path / "results")
        cfg.paths.figures_dir = str(tmp_path / "figures")
    return cfg


def test_ann_recall_runs_resumes_and_plots(tmp_path):
    cfg = _tiny_recall_config(tmp_path)
    store = ResultStore(cfg.paths.results_dir, "ann_recall", cfg, ann_recall.RESULT_KEYS)
    df = ann_recall.run(cfg, store)
    assert len(df) == 4 * 2 * 4  # methods x bits x k in {1, 2, 4, 8}
    for _, curve in df.groupby(["method", "bits"]):
        recall = curve.sort_values("k")["recall"].to_numpy()
        assert np.all(np.diff(recall) >= 0) and 0 <= recall[0] <= recall[-1] <= 1
    at_k1 = df[df["k"] == 1].set_index(["method", "bits"])["recall"]
    for method in ("turboquant_mse", "pq", "rabitq"):
        assert at_k1[(method, 2)] <= at_k1[(method, 4)] + 0.05  # more bits do not lose recall (40 queries)
    assert set(df["faiss_threads"]) == {2} and set(df["torch_threads"]) == {2}
    mtime = store.csv_path.stat().st_mtime_ns
    again = ann_recall.run(cfg, store)  # every unit done: nothing recomputed
    assert store.csv_path.stat().st_mtime_ns == mtime and len(again) == len(df)
    paths = ann_recall.plot(again, cfg, cfg.paths.figures_dir)
    assert {p.suffix for p in paths} == {".png", ".pdf", ".md"}
    summary = paths[-1].read_text()
    assert "turboquant_mse" in summary and "Orderings" in summary


def test_ann_recall_config_lists_the_paper_settings():
    cfg = _config("ann_recall")
    assert list(cfg.experiment.bits) == [2, 4] and cfg.experiment.k_max == 64
    assert {"glove50", "dbpedia_minilm"} <= set(cfg.experiment.datasets)
    assert cfg.experiment.datasets.glove50.substitution  # the stand-in is declared


def test_ann_recall_rejects_missing_sizes(tmp_path):
    cfg = _tiny_recall_config(tmp_path)
    with open_dict(cfg):
        cfg.experiment.sizes.quick = OmegaConf.create({"other": {"n_base": 10, "n_queries": 2}})
    store = ResultStore(cfg.paths.results_dir, "ann_recall", cfg, ann_recall.RESULT_KEYS)
    with pytest.raises(ValueError, match="no sizes for datasets"):
        ann_recall.run(cfg, store)


def test_ann_indexing_time_runs_and_writes_the_table(tmp_path):
    from experiments import ann_indexing_time

    cfg = _config("ann_indexing_time", ["experiment.methods=[turboquant_mse,pq,rabitq,exact]", "experiment.repeats=2",
                                         "experiment.single_queries=3"])
    with open_dict(cfg):
        cfg.experiment.datasets = OmegaConf.create({"random_sphere": SPHERE})
        cfg.experiment.sizes.quick = OmegaConf.create(
            {"n_base": 500, "n_queries": 20, "data": ["random_sphere:16", "random_sphere:24"]})
        cfg.paths.results_dir = str(tmp_path / "results")
        cfg.paths.figures_dir = str(tmp_path / "figures")
    store = ResultStore(cfg.paths.results_dir, "ann_indexing_time", cfg, ann_indexing_time.RESULT_KEYS)
    df = ann_indexing_time.run(cfg, store)
    builds = df[df["measure"] == "build"]
    assert len(builds) == 2 * 7  # 2 dims x (TurboQuant {haar, hadamard} x {auto, torch}, PQ, RaBitQ, exact)
    assert (builds.loc[builds["method"] == "exact", "bits_per_coordinate"] == 32).all()
    assert set(builds["dim"]) == {16, 24} and (builds["build_s"] > 0).all()
    tq_builds = builds[builds["method"] == "turboquant_mse"]
    assert (tq_builds["train_s"] < 0.01).all()  # data-oblivious
    # every row says which encoder ran: auto picks the numba encoder on this CPU (numba is a dependency)
    assert dict(zip(tq_builds["backend"], tq_builds["encoder"])) == {"auto": "numba", "torch": "torch"}
    assert (builds["numba_threads"] >= 1).all() and builds["load_average"].notna().all()
    tq_search = df[(df["measure"] == "search") & (df["method"] == "turboquant_mse")]
    assert set(tq_search["scorer"]) == {"fastscan", "dense", "lut"} and set(tq_search["backend"]) == {"auto"}
    # the scorers rank identically (fastscan re-ranks its candidates exactly), so they reach the same recall
    by_scorer = tq_search[tq_search["batch"] == 1].groupby(["data", "rotation", "scorer"])["recall_at_k"].first()
    for scorer in ("fastscan", "lut"):
        assert (by_scorer.xs("dense", level="scorer") == by_scorer.xs(scorer, level="scorer")).all()
    exact_search = df[(df["measure"] == "search") & (df["method"] == "exact")]
    assert len(exact_search) == 2 * 2 and (exact_search["recall_at_1"] == 1).all()  # 2 dims x {batch, single}
    paths = ann_indexing_time.plot(df, cfg, cfg.paths.figures_dir)
    assert {p.name for p in paths} >= {"ann_qps_recall_0k_partial.png", "ann_indexing_time_0k_partial.png"}
    text = paths[-1].read_text()
    assert "239.75" in text and "PQ training time / TurboQuant" in text and "queries_per_s" in text
    assert "TurboQuant_mse (hadamard, numba via auto)" in text and "torch reference / fast path" in text


def test_ann_indexing_time_warm_up_prints_no_training_warning(capfd):
    """The untimed warm-up trains PQ on 2048 rows, short of faiss's k-means minimum: that is expected there, so it
    prints nothing (faiss printed a line per sub-quantizer, 2,425 in the main job), while a short timed build
    would still warn."""
    from experiments import ann_indexing_time
    from experiments.data.embeddings import EmbeddingDataset

    base = np.random.default_rng(0).standard_normal((12_000, 8)).astype(np.float32)
    data = EmbeddingDataset("random", 8, base, base[:4], "random", None, {})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        builds, _ = ann_indexing_time._timed_builds("pq", 4, data, {}, repeats=1, cheap_s=0.0)
    assert len(builds) == 1 and builds[0].index.ntotal == 12_000
    assert "WARNING clustering" not in capfd.readouterr().err


def test_ann_indexing_time_rejects_a_missing_gpu(tmp_path, monkeypatch):
    from experiments import ann_indexing_time

    monkeypatch.setattr(ann_indexing_time.torch.cuda, "is_available", lambda: False)
    cfg = _config("ann_indexing_time", ["experiment.devices=[cpu,cuda]"])
    with open_dict(cfg):
        cfg.paths.results_dir = str(tmp_path / "results")
    store = ResultStore(cfg.paths.results_dir, "ann_indexing_time", cfg, ann_indexing_time.RESULT_KEYS)
    with pytest.raises(ValueError, match="no such device"):
        ann_indexing_time.run(cfg, store)


def test_ann_indexing_time_paper_rows_prefer_gpu_resident_timings():
    """Table 2's TurboQuant column is an A100 time: a GPU encode on resident data is compared when present,
    the fastest CPU encoder otherwise; PQ always from its CPU build."""
    import pandas as pd

    from experiments import ann_indexing_time

    common = {"data": "random_sphere_d1536", "n_base": 100_000, "dim": 1536, "rotation": "haar", "backend": "auto",
              "faiss_threads": 2, "torch_threads": 2}
    rows = [
        {**common, "method": "turboquant_mse", "measure": "build", "encoder": "numba", "gpu": "", "build_s": 0.8},
        {**common, "method": "turboquant_mse", "measure": "build", "encoder": "triton", "gpu": "GPU X", "build_s": 0.3},
        {**common, "method": "pq", "measure": "build", "encoder": "faiss", "gpu": "", "rotation": "", "build_s": 400.0},
    ]
    cpu_only = {r["id"]: r for r in ann_indexing_time.paper_comparison(pd.DataFrame(rows[:1] + rows[2:]))}
    assert cpu_only["ann_indexing_time.seconds.turboquant.d1536"]["value"] == 0.8
    rows.append({**common, "method": "turboquant_mse", "measure": "encode_resident", "encoder": "triton",
                 "gpu": "GPU X", "build_s": 0.005})
    found = {r["id"]: r for r in ann_indexing_time.paper_comparison(pd.DataFrame(rows))}
    assert found["ann_indexing_time.seconds.turboquant.d1536"]["value"] == 0.005
    assert "GPU X" in found["ann_indexing_time.seconds.turboquant.d1536"]["detail"]
    assert found["ann_indexing_time.seconds.pq.d1536"]["value"] == 400.0
    text = ann_indexing_time.table2_markdown(pd.DataFrame(rows).assign(train_s=0.0, add_s=pd.DataFrame(rows)["build_s"]))
    assert "data already on the device" in text and "[data on the GPU] 0.005 s" in text
