"""The experiment framework: config composition, the resumable result store, figures, run.py."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException

import run
from experiments.io import ResultStore, experiment_sizes, recorded_unit_ids
from experiments.kv_generation import method_draw
from experiments.plotting import figure_title, save_figure

REPO = Path(run.__file__).resolve().parent
CONFIGS = REPO / "configs"
EXPERIMENT_CONFIGS = sorted(p.stem for p in (CONFIGS / "experiment").glob("*.yaml"))


def compose_config(overrides: list[str]):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        return compose(config_name="config", overrides=overrides)


@pytest.mark.parametrize("name", EXPERIMENT_CONFIGS)
@pytest.mark.parametrize("scale", ["quick", "paper"])
def test_every_experiment_config_composes(name: str, scale: str) -> None:
    cfg = compose_config([f"experiment={name}", f"scale={scale}"])
    assert cfg.experiment.name == name, "experiment.name must equal the config file's name (run.py imports it)"
    if "sizes" in cfg.experiment:
        assert experiment_sizes(cfg) is not None
    assert importlib.util.find_spec(f"experiments.{name}") is not None, f"configs/experiment/{name}.yaml has no module"


def test_default_config_points_at_existing_groups() -> None:
    cfg = compose_config([])
    assert cfg.dataset.name == "dbpedia_minilm"
    assert cfg.quantizer.rotation == "haar"
    assert cfg.paths.results_dir == "results" and cfg.paths.figures_dir == "figures"


def test_configs_take_only_the_keys_that_are_read() -> None:
    """quantizer.bits is swept by each experiment (experiment.bits), so the quantizer group has no such key; an
    experiment without a dataset does not accept dataset=."""
    with pytest.raises(ConfigCompositionException, match="quantizer.bits"):
        compose_config(["experiment=distortion", "quantizer.bits=4"])
    with pytest.raises(ConfigCompositionException, match="dataset"):
        compose_config(["experiment=needle", "dataset=glove50"])


def test_experiment_sizes_rejects_a_scale_without_sizes() -> None:
    cfg = compose_config(["experiment=distortion", "scale.name=laptop"])
    with pytest.raises(ValueError, match="laptop"):
        experiment_sizes(cfg)


CONFIG = {"experiment": {"name": "toy", "sizes": {"quick": {"n": 3}}}, "dataset": {"name": "toy_data"},
          "scale": {"name": "quick"}, "seed": 0, "paths": {"results_dir": "/somewhere"}}


def test_store_saves_resumes_and_separates_configs(tmp_path: Path) -> None:
    store = ResultStore(tmp_path, "toy", CONFIG)
    unit = {"method": "mse", "bits": 1}
    assert not store.is_done(unit)
    store.save_unit(unit, [{"quantity": "a", "value": 1.5}, {"quantity": "b", "value": 2.5}])
    assert store.is_done({"bits": 1, "method": "mse"}), "unit identity must not depend on key order"
    assert not store.is_done({"method": "mse", "bits": 2})

    df = store.frame()
    assert list(df["value"]) == [1.5, 2.5]
    assert set(df["dataset"]) == {"toy_data"} and set(df["method"]) == {"mse"} and set(df["bits"]) == {1}

    # a store for the same experiment and config (a resumed run) sees the unit as done
    assert ResultStore(tmp_path, "toy", json.loads(json.dumps(CONFIG))).is_done(unit)
    # output paths do not change the results' identity
    moved = {**CONFIG, "paths": {"results_dir": "/elsewhere"}}
    assert ResultStore(tmp_path, "toy", moved).config_id == store.config_id
    # a changed result-relevant value is a different config: not done, and its frame holds no old rows
    other = ResultStore(tmp_path, "toy", {**CONFIG, "seed": 1})
    assert other.config_id != store.config_id and not other.is_done(unit) and other.frame().empty
    assert len(other.frame(all_configs=True)) == 2

    # another experiment lives in its own folder
    ResultStore(tmp_path, "other_toy", CONFIG).save_unit(unit, [{"value": 9.0}])
    assert len(store.frame()) == 2
    assert (tmp_path / "toy" / "config.json").exists() and (tmp_path / "toy" / "runs" / f"{store.config_id}.json").exists()


def test_store_result_keys_keep_finished_units_when_the_sweep_grows(tmp_path: Path) -> None:
    keys = ("dataset", "seed", "experiment.sizes")
    small = ResultStore(tmp_path, "toy", {**CONFIG, "experiment": {**CONFIG["experiment"], "bits": [1]}}, keys)
    small.save_unit({"bits": 1}, [{"value": 1.0}])
    grown = ResultStore(tmp_path, "toy", {**CONFIG, "experiment": {**CONFIG["experiment"], "bits": [1, 2]}}, keys)
    assert grown.is_done({"bits": 1}) and not grown.is_done({"bits": 2})
    grown.save_unit({"bits": 2}, [{"value": 2.0}])
    assert list(grown.frame([{"bits": 2}])["value"]) == [2.0]
    with pytest.raises(ValueError, match="not in the config"):
        ResultStore(tmp_path, "toy", CONFIG, ("no.such.key",))


def test_store_merges_the_units_and_configs_of_processes_that_share_a_config(tmp_path: Path) -> None:
    keys = ("dataset", "seed")
    first = ResultStore(tmp_path, "toy", {**CONFIG, "only": ["a"]}, keys)  # two processes, one method each
    second = ResultStore(tmp_path, "toy", {**CONFIG, "only": ["b"]}, keys)
    unit = {m: {"method": m, "method_options": "x", "context": 1} for m in "ab"}
    first.record_units([unit["a"]], versioned=("method_options",))
    second.record_units([unit["b"]], versioned=("method_options",))
    recorded = set(recorded_unit_ids(second.provenance()))
    assert recorded == {second.unit_id(unit["a"]), second.unit_id(unit["b"])}
    record = json.loads(second.run_path.read_text())
    assert sorted(c["config"]["only"] for c in record["configs"].values()) == [["a"], ["b"]]
    changed = {**unit["a"], "method_options": "y"}  # method a's options changed: its old cell stops counting
    first.record_units([changed], versioned=("method_options",))
    assert set(recorded_unit_ids(first.provenance())) == {first.unit_id(changed), first.unit_id(unit["b"])}
    assert "unit_ids" not in first.provenance()  # the cells are recorded once, as unit_slots


def test_store_records_each_draw_of_a_method_as_its_own_cell(tmp_path: Path) -> None:
    # seeds 1-2 of a method run by a later process than its seed 0: all three count
    store = ResultStore(tmp_path, "toy", CONFIG, ("dataset", "seed"))

    def unit(seed: int, bits: float = 3.5) -> dict:
        options = json.dumps({"cache": "turboquant", "options": {"bits": bits, "seed": seed}}, sort_keys=True)
        return {"method": "tq", "method_options": options, "context": 1}
    store.record_units([unit(0)], versioned=("method_options",), replicate=method_draw)
    store.record_units([unit(1), unit(2)], versioned=("method_options",), replicate=method_draw)
    assert set(recorded_unit_ids(store.provenance())) == {store.unit_id(unit(s)) for s in (0, 1, 2)}
    store.record_units([unit(0, bits=2.5)], versioned=("method_options",), replicate=method_draw)  # new options
    assert set(recorded_unit_ids(store.provenance())) == {store.unit_id(u) for u in (unit(0, 2.5), unit(1), unit(2))}


def test_store_keeps_the_cells_of_a_record_written_before_slots(tmp_path: Path) -> None:
    store = ResultStore(tmp_path, "toy", CONFIG, ("dataset", "seed"))
    unit = {m: {"method": m, "method_options": "x"} for m in "ab"}
    store.record_provenance(unit_ids=[store.unit_id(unit["a"])])  # as a session-6 record holds them
    store.record_units([unit["b"]], versioned=("method_options",))
    assert set(recorded_unit_ids(store.provenance())) == {store.unit_id(unit["a"]), store.unit_id(unit["b"])}


def test_store_rewrites_a_unit_whole_and_rejects_bad_input(tmp_path: Path) -> None:
    store = ResultStore(tmp_path, "toy", CONFIG)
    store.save_unit({"bits": 1}, [{"value": 1.0}])
    store.save_unit({"bits": 1}, [{"value": 3.0}])
    assert list(store.frame()["value"]) == [3.0]
    with pytest.raises(ValueError, match="no rows"):
        store.save_unit({"bits": 2}, [])
    with pytest.raises(ValueError, match="clash"):
        store.save_unit({"config_id": "x"}, [{"value": 1.0}])
    with pytest.raises(ValueError, match="contradict"):
        store.save_unit({"bits": 3}, [{"bits": 4}])
    with pytest.raises(ValueError, match="experiment name"):
        ResultStore(tmp_path, "../escape", CONFIG)


def test_store_reads_hash_ids_back_as_strings(tmp_path: Path) -> None:
    store = ResultStore(tmp_path, "toy", CONFIG)
    store.config_id = "012345678901"  # an all-digit hash must survive the CSV round trip
    store.context["config_id"] = store.config_id
    store.save_unit({"bits": 1}, [{"value": 1.0}])
    assert store.is_done({"bits": 1}) and len(store.frame()) == 1


def test_provenance_reaches_the_frame(tmp_path: Path) -> None:
    store = ResultStore(tmp_path, "toy", CONFIG)
    store.record_provenance(description="toy vectors", substitution="stand-in")
    store.save_unit({"bits": 1}, [{"value": 1.0}])
    provenance = store.frame().attrs["provenance"]
    assert provenance["description"] == "toy vectors"
    assert "toy vectors" in figure_title("What", provenance) and "stand-in" in figure_title("What", provenance)
    with pytest.raises(ValueError, match="names no data"):
        figure_title("What", {})


def test_save_figure_writes_png_and_pdf(tmp_path: Path) -> None:
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1])
    paths = save_figure(fig, tmp_path / "figs", "a figure/name")
    assert [p.suffix for p in paths] == [".png", ".pdf"]
    assert all(p.exists() and p.stat().st_size > 0 and p.parent == tmp_path / "figs" for p in paths)


def test_run_helpers() -> None:
    assert run.resolve_path("results") == REPO / "results"
    assert run.resolve_path("/abs/results") == Path("/abs/results")
    with pytest.raises(ValueError, match="unknown experiment"):
        run.load_experiment("no_such_experiment")


def run_cli(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    """``python run.py -m ...`` on tiny random-sphere data, outputs under tmp_path."""
    command = [
        sys.executable, str(REPO / "run.py"), "-m", "dataset=random_sphere", "dataset.dim=16",
        "experiment.sizes.quick.n_base=200", "experiment.sizes.quick.n_queries=10",
        f"paths.results_dir={tmp_path / 'results'}", f"paths.figures_dir={tmp_path / 'figures'}",
        f"hydra.sweep.dir={tmp_path / 'multirun'}", *overrides,
    ]
    env = {**os.environ, "HYDRA_FULL_ERROR": "1"}
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.mark.slow
def test_hydra_multirun_appends_jobs_to_one_store(tmp_path: Path) -> None:
    """A sweep over a result-relevant value: one CSV, one run record per job, figures kept apart."""
    run_cli(tmp_path, "experiment=distortion", "scale=quick", "experiment.bits=[1]", "experiment.quantizer_seeds=[0]",
            "quantizer.rotation=haar,hadamard")
    df = pd.read_csv(tmp_path / "results" / "distortion" / "results.csv")
    assert set(df["rotation"]) == {"haar", "hadamard"} and len(df) == 4
    assert len(list((tmp_path / "results" / "distortion" / "runs").glob("*.json"))) == 2
    assert not (tmp_path / "figures").exists(), "jobs differing in a swept value must not share figures/"
    pngs = sorted(p.relative_to(tmp_path / "multirun").parts for p in tmp_path.rglob("*.png"))
    assert pngs == [("0", "figures", "fig3_distortion_random_sphere_partial.png"),  # tiny sizes: a partial run
                    ("1", "figures", "fig3_distortion_random_sphere_partial.png")], pngs  # each job's own (git-ignored) folder


@pytest.mark.slow
def test_hydra_multirun_over_experiments_writes_figures_in_place(tmp_path: Path) -> None:
    """``make figures`` style: experiment and scale do not split the figures folder (the tiny-size overrides
    this test needs, which ``make figures`` does not pass, are excluded from the split like them)."""
    tiny = "dataset.dim,experiment.sizes.quick.n_base,experiment.sizes.quick.n_queries,experiment.pair_chunk"
    run_cli(tmp_path, "experiment=distortion,ip_variance", "scale=quick", "experiment.pair_chunk=1000",
            f"hydra.job.config.override_dirname.exclude_keys=[experiment,dataset,scale,paths.results_dir,paths.figures_dir,{tiny}]")
    pngs = sorted((tmp_path / "figures").rglob("*.png"))
    # the tiny sizes leave out part of the configs' grids: the figures say "partial" (experiments.coverage)
    assert [p.name for p in pngs] == ["fig2_ip_variance_random_sphere_partial.png", "fig3_distortion_random_sphere_partial.png"]
    assert pngs[0].parent == pngs[1].parent, "the two experiments' jobs must share one figures folder"
    assert "experiment=" not in pngs[0].parent.name and "scale=" not in pngs[0].parent.name
    assert (tmp_path / "results" / "distortion" / "results.csv").exists()
    assert (tmp_path / "results" / "ip_variance" / "results.csv").exists()
