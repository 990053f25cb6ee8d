"""distortion / ip_histogram / ip_variance end to end on tiny random-sphere data (paper Figs. 1-3)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

import run
from experiments import distortion, ip_histogram, ip_variance
from experiments.compare import load_paper_numbers

CONFIGS = Path(run.__file__).resolve().parent / "configs"
DIM, N_BASE, N_QUERIES = 64, 1500, 40


def tiny_config(tmp_path: Path, experiment: str, *overrides: str):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        return compose(
            config_name="config",
            overrides=[
                f"experiment={experiment}", "dataset=random_sphere", f"dataset.dim={DIM}",
                f"experiment.sizes.quick.n_base={N_BASE}", f"experiment.sizes.quick.n_queries={N_QUERIES}",
                "experiment.pair_chunk=7000",  # several chunks, one of them partial
                f"paths.results_dir={tmp_path / 'results'}", f"paths.figures_dir={tmp_path / 'figures'}",
                *overrides,
            ],
        )


def assert_outputs(outputs: run.RunOutputs, experiment: str, n_figures: int = 1) -> pd.DataFrame:
    assert outputs.results_csv.exists() and outputs.config_json.exists()
    record = json.loads(outputs.config_json.read_text())
    assert record["config"]["experiment"]["name"] == experiment
    assert record["provenance"]["dataset"] == "random_sphere" and record["provenance"]["dim"] == DIM
    assert sorted(p.suffix for p in outputs.figures) == sorted([".pdf", ".png"] * n_figures)
    assert all(p.exists() and p.stat().st_size > 0 for p in outputs.figures)
    return pd.read_csv(outputs.results_csv)


def test_distortion_matches_theory_and_bounds_and_resumes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tiny_config(tmp_path, "distortion", "experiment.bits=[1,2]", "experiment.quantizer_seeds=[0,1]")
    df = assert_outputs(run.run_experiment(cfg), "distortion")
    assert len(df) == 8 and set(df["method"]) == {"mse", "prod"} and set(df["quantizer_seed"]) == {0, 1}
    assert (df["n_pairs"] == N_BASE * N_QUERIES).all()
    for row in df.itertuples():
        if row.method == "mse":  # Theorem 1: codebook prediction, and between the bounds
            assert row.d_mse == pytest.approx(row.predicted_d_mse, rel=0.03)
            assert 4.0 ** -row.bits < row.d_mse < math.sqrt(3) * math.pi / 2 * 4.0 ** -row.bits
        else:  # Theorem 2: d * D_prod = (pi/2) * D_mse(b-1), unbiased
            assert row.d_prod_times_d == pytest.approx(row.predicted_d_prod_times_d, rel=0.08)
            assert abs(row.mean_ip_error) < 4 * math.sqrt(row.d_prod / N_BASE)
    comparison = {item["id"]: item for item in distortion.paper_comparison(df)}
    ids = set(comparison)
    assert ids == {f"distortion.{q}.b{b}" for q in ("d_mse", "d_prod_times_d") for b in (1, 2)}
    prod_b1 = df[(df["method"] == "prod") & (df["bits"] == 1)]["d_prod_times_d"]  # the mean and SE over the 2 draws
    assert comparison["distortion.d_prod_times_d.b1"]["value"] == pytest.approx(prod_b1.mean())
    assert comparison["distortion.d_prod_times_d.b1"]["se"] == pytest.approx(prod_b1.std(ddof=1) / math.sqrt(2))
    assert ids <= {n.id for n in load_paper_numbers()}
    summary = pd.read_csv(tmp_path / "results" / "distortion" / "summary_random_sphere_partial.csv")
    qjl = summary[(summary["method"] == "prod") & (summary["bits"] == 1)].iloc[0]  # QJL on x: pi/2 - E<x,y>^2
    ip_squared = df[(df["method"] == "prod") & (df["bits"] == 1)]["mean_squared_true_ip"].mean()
    assert qjl["predicted_d_prod_times_d_these_queries"] == pytest.approx(math.pi / 2 - ip_squared)
    assert ip_squared == pytest.approx(1 / DIM, rel=0.2)  # independent directions on the sphere: E<x,y>^2 = 1/d

    # resume: a finished unit is never measured again; a grown sweep measures only the new units
    measured: list[object] = []
    original = distortion.measure_distortion

    def counting(quantizer, data, pair_chunk):
        measured.append(quantizer)
        return original(quantizer, data, pair_chunk)

    monkeypatch.setattr(distortion, "measure_distortion", counting)
    again = run.run_experiment(cfg)
    assert measured == [] and again.n_rows == 8
    grown = run.run_experiment(tiny_config(tmp_path, "distortion", "experiment.bits=[1,2,3]",
                                           "experiment.quantizer_seeds=[0,1]"))
    assert len(measured) == 4 and grown.n_rows == 12
    assert len(pd.read_csv(grown.results_csv)) == 12


def test_ip_histogram_streams_all_pairs(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path, "ip_histogram", "experiment.bits=[1,2]", "experiment.n_bins=41",
                      "experiment.bias={seeds: 3, n_base: 300, n_queries: 20}")
    df = assert_outputs(run.run_experiment(cfg), "ip_histogram")
    summaries = df[(df["record"] == "summary") & (df["pairs"] == "all")]
    assert len(summaries) == 4
    for s in summaries.itertuples():
        bins = df[(df["record"] == "bin") & (df["method"] == s.method) & (df["bits"] == s.bits)]
        assert len(bins) == 41
        assert bins["count"].sum() + s.below_range + s.above_range == s.n_pairs == N_BASE * N_QUERIES
        if s.method == "prod":  # unbiased: no mean error, no dependence on <y, x>
            assert abs(s.mean_error) < 4 * s.std_error / math.sqrt(N_BASE)
            assert abs(s.error_slope_on_true_ip) < 0.15
        else:  # shrinkage towards 0: slope of the error on <y, x> is about -D_mse
            assert s.error_slope_on_true_ip < -0.5 * 4.0 ** -s.bits

    # the chunked summary equals a single-chunk one
    whole = tiny_config(tmp_path / "whole", "ip_histogram", "experiment.bits=[1]", "experiment.n_bins=41",
                        "experiment.bias={seeds: 3, n_base: 300, n_queries: 20}", "experiment.pair_chunk=100000000")
    one = pd.read_csv(run.run_experiment(whole).results_csv)
    pick = lambda frame: frame[(frame["record"] == "summary") & (frame["bits"] == 1)].sort_values(["method", "pairs"])  # noqa: E731
    pd.testing.assert_series_equal(pick(one)["mean_squared_error"].reset_index(drop=True),
                                   pick(df)["mean_squared_error"].reset_index(drop=True), rtol=1e-9)
    # unbiasedness across quantizer seeds: one row per seed, and a z-score per b for the comparison
    seed_rows = df[df["record"] == "seed_bias"]
    assert len(seed_rows) == 4 * 3 and set(seed_rows["quantizer_seed"]) == {0, 1, 2}
    comparison = {i["id"]: i["value"] for i in ip_histogram.paper_comparison(df)}
    assert set(comparison) == {"ip_histogram.prod_bias_z.b1", "ip_histogram.prod_bias_z.b2"}
    assert all(abs(z) < 6 for z in comparison.values())


def test_ip_variance_buckets_by_inner_product(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path, "ip_variance", "experiment.n_bins=31", "experiment.quantile_sample_pairs=20000")
    df = assert_outputs(run.run_experiment(cfg), "ip_variance")
    summaries = df[df["record"] == "summary"]
    n_buckets = len(cfg.experiment.bucket_quantiles) - 1
    assert len(summaries) == 2 * n_buckets and set(summaries["bits"]) == {2}
    for method, rows in summaries.groupby("method"):
        rows = rows.sort_values("bucket")
        assert rows["mean_true_ip"].is_monotonic_increasing
        assert ((rows["bucket_low"] <= rows["mean_true_ip"]) & (rows["mean_true_ip"] < rows["bucket_high"])).all()
        covered = rows["n_pairs"].sum() / (N_BASE * N_QUERIES)
        assert covered == pytest.approx(0.999 - 0.05, abs=0.03)
    mse = summaries[summaries["method"] == "mse"].sort_values("bucket")
    assert mse["mean_error"].iloc[-1] < mse["mean_error"].iloc[0], "mse's error shrinks large inner products"


def test_bad_inputs_are_named(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path, "distortion", "experiment.methods=[nope]")
    with pytest.raises(ValueError, match="nope"):
        run.run_experiment(cfg)
    with pytest.raises(ValueError, match="bucket_quantiles"):
        ip_variance.bucket_edges(None, [0.5, 0.2], 100, 0)  # type: ignore[arg-type]


def test_a_killed_run_resumes_from_its_finished_units(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tiny_config(tmp_path, "distortion", "experiment.bits=[1,2]", "experiment.methods=[mse]",
                      "experiment.quantizer_seeds=[0]")
    original, calls = distortion.measure_distortion, []

    def dies_on_second_unit(quantizer, data, pair_chunk):
        calls.append(quantizer)
        if len(calls) == 2:
            raise KeyboardInterrupt("killed")
        return original(quantizer, data, pair_chunk)

    monkeypatch.setattr(distortion, "measure_distortion", dies_on_second_unit)
    with pytest.raises(run.Interrupted, match="stopped after 1 unit;") as stopped:
        run.run_experiment(cfg)
    assert stopped.value.units == 1
    csv = tmp_path / "results" / "distortion" / "results.csv"
    assert list(pd.read_csv(csv)["bits"]) == [1]  # the finished unit was saved whole
    calls.clear()
    monkeypatch.setattr(distortion, "measure_distortion", lambda q, d, c: (calls.append(q), original(q, d, c))[1])
    assert run.run_experiment(cfg).n_rows == 2 and len(calls) == 1  # only b = 2 is measured again


def test_streamed_statistics_equal_direct_ones() -> None:
    """Chunked, grouped histogram and moments equal NumPy's on the whole array."""
    from experiments.streaming_stats import FixedBinHistogram, PairMoments

    rng = np.random.default_rng(0)
    true, error = rng.normal(0.1, 0.2, 10_000), rng.normal(0.0, 0.05, 10_000) - 0.3 * 0.1
    group = (true > 0.1).astype(int)
    histogram, moments = FixedBinHistogram(-0.1, 0.1, 20, n_groups=2), PairMoments(n_groups=2)
    for part in np.array_split(np.arange(true.size), 7):
        histogram.add(error[part], group[part])
        moments.add(true[part], error[part], group[part])
    for g in (0, 1):
        members = group == g
        expected, _ = np.histogram(error[members], bins=histogram.edges)
        np.testing.assert_array_equal(histogram.counts[g], expected)
        assert histogram.underflow[g] == (error[members] < -0.1).sum()
        assert histogram.overflow[g] == (error[members] >= 0.1).sum()
        summary = moments.summary(g)
        assert summary["n_pairs"] == members.sum()
        assert summary["mean_error"] == pytest.approx(error[members].mean())
        assert summary["std_error"] == pytest.approx(error[members].std())
        slope = np.polyfit(true[members], error[members], 1)[0]
        assert summary["error_slope_on_true_ip"] == pytest.approx(slope)
    assert moments.merged().summary()["mean_squared_error"] == pytest.approx((error**2).mean())
    with pytest.raises(ValueError, match="group labels"):
        histogram.add(error[:3], np.array([0, 1, 2]))
