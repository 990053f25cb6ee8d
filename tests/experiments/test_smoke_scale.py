"""``scale=smoke``: every experiment's whole run (config → run → store → figure) at its smoke sizes.

The sizes are the configs' own ``sizes.smoke`` blocks; only what would make a test slow or need a download is
swapped: embedding sets become random unit vectors of the same name (the loaders have their own tests), and the
LLM experiments run a tiny random Llama instead of SmolLM2 (``scale=smoke`` itself uses SmolLM2). The kernels
experiment has its own smoke switch (tests/kernels/test_kernel_experiment.py).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf, open_dict

import run
from tests.experiments.llm_fixtures import save_tiny_llama
from tests.experiments.test_longbench_experiment import _tiny_model

CONFIGS = Path(run.__file__).resolve().parent / "configs"
pytestmark = pytest.mark.slow


def smoke_config(tmp_path: Path, *overrides: str):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        cfg = compose("config", overrides=["scale=smoke", *overrides, f"paths.results_dir={tmp_path / 'results'}",
                                           f"paths.figures_dir={tmp_path / 'figures'}"])
    assert cfg.scale.name == "smoke"
    return cfg


def random_sphere(dim: int):
    return {**OmegaConf.to_container(OmegaConf.load(CONFIGS / "dataset" / "random_sphere.yaml")), "dim": dim,
            "label": f"uniform random unit vectors ({dim}-d)"}


def run_and_check(cfg, tmp_path: Path) -> pd.DataFrame:
    outputs = run.run_experiment(cfg)
    assert outputs.n_rows > 0 and outputs.figures and all(path.exists() for path in outputs.figures)
    assert all(tmp_path in path.parents for path in outputs.figures)
    frame = pd.read_csv(outputs.results_csv)
    assert set(frame["scale"]) == {"smoke"}
    return frame


@pytest.mark.parametrize("name", ["distortion", "ip_histogram", "ip_variance"])
def test_embedding_experiment_smoke(name: str, tmp_path: Path) -> None:
    cfg = smoke_config(tmp_path, f"experiment={name}", "dataset=random_sphere", "dataset.dim=32")
    frame = run_and_check(cfg, tmp_path)
    assert set(frame["method"]) == {"mse", "prod"}


@pytest.mark.parametrize("name", ["ann_recall", "ann_indexing_time"])
def test_ann_experiment_smoke(name: str, tmp_path: Path) -> None:
    cfg = smoke_config(tmp_path, f"experiment={name}", "experiment.threads=1")
    with open_dict(cfg):
        for key in cfg.experiment.datasets:  # low dimensions: faiss PQ trains a codebook per 2-4 coordinates
            cfg.experiment.datasets[key] = random_sphere(16)
        if name == "ann_indexing_time":  # one build per method; the named sets only (random_sphere:200 is 200-d)
            cfg.experiment.repeats = 1
            cfg.experiment.sizes.smoke.data = [entry for entry in cfg.experiment.sizes.smoke.data if ":" not in entry]
    frame = run_and_check(cfg, tmp_path)
    assert set(frame["method"]) == set(cfg.experiment.methods), "every method runs at smoke sizes"


@pytest.mark.skipif(importlib.util.find_spec("needlehaystack") is None, reason="needlehaystack==0.1.0 not installed")
def test_needle_smoke(tmp_path: Path) -> None:
    cfg = smoke_config(tmp_path, "experiment=needle", "experiment.generation.max_new_tokens=4")
    with open_dict(cfg):
        cfg.model = {"name": "tiny", "display_name": "tiny random Llama", "dtype": "float32",
                     "pretrained": str(save_tiny_llama(tmp_path / "tiny_llama", head_dim=64, num_layers=6))}  # KIVI: groups of 32; vLLM: 2+2 fp16 layers
    frame = run_and_check(cfg, tmp_path)
    seeds = len(cfg.experiment.method_seeds)
    randomized = sum("seed" in method.options for method in cfg.experiment.methods.values())
    assert frame["unit_id"].nunique() == len(cfg.experiment.methods) + (seeds - 1) * randomized
    assert set(frame["context"]) == set(cfg.experiment.sizes.smoke.contexts)


def test_longbench_smoke(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from experiments.longbench import experiment as lb

    loaded = _tiny_model()
    monkeypatch.setattr(lb, "load_model", lambda spec, device: loaded)
    cfg = smoke_config(tmp_path, "experiment=longbench")
    frame = run_and_check(cfg, tmp_path)
    assert set(frame["method"]) == set(cfg.experiment.methods) and set(frame["task"]) == set(cfg.experiment.datasets)
    table = next((tmp_path / "results" / "longbench").glob("summary_*.md")).read_text().splitlines()[0]
    assert table.startswith("# LongBench-style substitute tasks") and "LongBench-E" not in table
