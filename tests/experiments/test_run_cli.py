"""run.py's user-facing conventions: app help, method subsets, Ctrl-C, Hydra launchers, scale=smoke."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import run

REPO = Path(run.__file__).resolve().parent
CONFIGS = REPO / "configs"
EXPERIMENTS = sorted(p.stem for p in (CONFIGS / "experiment").glob("*.yaml"))
TINY_DISTORTION = ["experiment=distortion", "dataset=random_sphere", "dataset.dim=16", "experiment.bits=[1]",
                   "experiment.sizes.smoke.n_base=200", "experiment.sizes.smoke.n_queries=10", "scale=smoke",
                   "experiment.quantizer_seeds=[0]"]


def compose_config(overrides: list[str], return_hydra_config: bool = False):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        return compose(config_name="config", overrides=overrides, return_hydra_config=return_hydra_config)


def run_cli(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    command = [sys.executable, str(REPO / "run.py"), *overrides, f"paths.results_dir={tmp_path / 'results'}",
               f"paths.figures_dir={tmp_path / 'figures'}", f"hydra.sweep.dir={tmp_path / 'multirun'}",
               f"hydra.run.dir={tmp_path / 'outputs'}"]
    env = {**os.environ, "HYDRA_FULL_ERROR": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def test_help_lists_every_experiment_and_the_launchers(tmp_path: Path) -> None:
    done = run_cli(tmp_path, "--help")
    assert done.returncode == 0, done.stderr[-2000:]
    experiments = done.stdout.split("== Experiments")[1].split("==", 2)[1]
    listed = [line.split()[0] for line in experiments.strip().splitlines()]
    assert sorted(listed) == EXPERIMENTS, "the help's experiment list must match configs/experiment/"
    assert "scale: gpu, paper, quick, smoke" in done.stdout and "hydra/launcher=joblib" in done.stdout


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_has_smoke_sizes(name: str) -> None:
    cfg = compose_config([f"experiment={name}", "scale=smoke"])
    assert "smoke" in cfg.experiment.sizes, f"configs/experiment/{name}.yaml needs a sizes.smoke block"
    assert cfg.paths.results_dir == "results/smoke", "smoke runs must not write over the quick/paper results"


def test_smoke_paths_yield_to_the_command_line() -> None:
    cfg = compose_config(["scale=smoke", "paths.figures_dir=/tmp/f"])
    assert cfg.paths.figures_dir == "/tmp/f" and cfg.scale.name == "smoke"


@pytest.mark.parametrize("experiment, only, kept", [
    ("distortion", ["prod"], ["prod"]),
    ("needle", ["kivi", "full"], ["full", "kivi"]),   # the experiment's order, not the override's
    ("longbench", "full", ["full"]),
])
def test_only_selects_methods_and_leaves_the_results_identity(experiment, only, kept) -> None:
    cfg = compose_config([f"experiment={experiment}", f"only={only}".replace("'", "")])
    run.select_methods(cfg)
    methods = cfg.experiment.methods
    assert (list(methods) if OmegaConf.is_list(methods) else list(methods.keys())) == kept
    assert "only" not in cfg


@pytest.mark.parametrize("experiment, only", [("distortion", "[foo]"), ("needle", "[]"), ("kernels", "[full]")])
def test_only_rejects_what_the_experiment_does_not_have(experiment: str, only: str) -> None:
    cfg = compose_config([f"experiment={experiment}", f"only={only}"])
    with pytest.raises(ValueError, match=f"only=.*{experiment}"):
        run.select_methods(cfg)


def test_ctrl_c_prints_one_line_and_keeps_the_stored_units(tmp_path: Path, monkeypatch, capsys) -> None:
    def interrupted_run(cfg, store):
        store.save_unit({"method": "a"}, [{"value": 1.0}])
        store.save_unit({"method": "b"}, [{"value": 2.0}])
        raise KeyboardInterrupt

    monkeypatch.setattr(run, "load_experiment", lambda name: SimpleNamespace(run=interrupted_run, plot=None))
    cfg = compose_config(["experiment=distortion", f"paths.results_dir={tmp_path}"])
    with pytest.raises(SystemExit) as exit_info:
        run.main(cfg)
    assert exit_info.value.code == 130
    assert capsys.readouterr().err.strip() == (
        "[distortion] stopped after 2 units; rerun the same command to resume (finished units are kept)")
    assert len(pd.read_csv(tmp_path / "distortion" / "results.csv")) == 2


@pytest.mark.slow
def test_joblib_multirun_runs_each_cell_as_a_job_into_one_store(tmp_path: Path) -> None:
    """Two jobs (rotations) in parallel worker processes append to one store (each skips the units stored, as
    every run does)."""
    sweep = ["-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", *TINY_DISTORTION,
             "quantizer.rotation=haar,hadamard"]
    done = run_cli(tmp_path, *sweep)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Joblib.Parallel(n_jobs=2" in done.stdout + done.stderr
    df = pd.read_csv(tmp_path / "results" / "distortion" / "results.csv")
    assert set(df["rotation"]) == {"haar", "hadamard"} and len(df) == 4 and df["config_id"].nunique() == 2
    assert len(list((tmp_path / "multirun").glob("*/figures/*.png"))) == 2  # layout: test_framework.py


def test_slurm_cluster_launcher_composes_onto_submitit() -> None:
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    cfg = compose_config(["hydra/launcher=slurm_cluster", "hydra.launcher.partition=gpu"], return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("submitit_launcher.SlurmLauncher")
    assert launcher.partition == "gpu" and launcher.max_num_timeout > 0 and launcher.gpus_per_node == 1


@pytest.mark.parametrize("name", ["needle", "ruler", "longbench", "kv_ablation"])
def test_every_method_fits_its_budget_at_the_smoke_context(name: str) -> None:
    """`make smoke` runs every configured method at the smoke context: a method given a memory budget must have a
    setting that fits it there (at 512 tokens KIVI's 128-token fp16 window alone is 25%, and the run failed)."""
    from tests.kvcache.tiny_llama import tiny_llama_config
    from turboquant.kvcache import build_cache

    cfg = compose_config([f"experiment={name}", "scale=smoke"])
    sizes = cfg.experiment.sizes.smoke
    context = min(sizes.get("contexts") or sizes.get("context_tokens"))
    budgeted = {key: method for key, method in cfg.experiment.methods.items()
                if method.get("options") and "memory_ratio" in method.options}
    for key, method in budgeted.items():
        build_cache(method.cache, tiny_llama_config(), context_length=context, max_new_tokens=32,
                    **OmegaConf.to_container(method.options, resolve=True))
