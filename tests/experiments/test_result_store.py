"""What the result store guarantees about its files beyond tests/test_bad_inputs.py's damaged-file cases:
runs of one second get their own Hydra folders, and a resumed store reads each changed file once."""

from __future__ import annotations

import os
from pathlib import Path

from hydra import compose, initialize_config_dir

import run
from experiments.io import ResultStore

CONFIGS = Path(run.__file__).resolve().parent / "configs"
CONFIG = {"experiment": {"name": "toy"}, "dataset": {"name": "toy_data"}, "scale": {"name": "quick"}, "seed": 0}


def test_hydra_run_dir_names_the_process() -> None:
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        cfg = compose(config_name="config", overrides=["experiment=distortion"], return_hydra_config=True)
    run_dir = cfg.hydra.run.dir
    assert run_dir.startswith("outputs/distortion/") and run_dir.endswith(f"_{os.getpid()}")


def test_store_parses_results_again_only_when_the_file_changes(tmp_path: Path, monkeypatch) -> None:
    store = ResultStore(tmp_path, "toy", CONFIG)
    store.save_unit({"bits": 1}, [{"value": 1.0}])
    reads = []
    read_text = Path.read_text
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: reads.append(self.name) or read_text(self, *a, **k))
    assert store.is_done({"bits": 1}) and not store.is_done({"bits": 2}) and len(store.frame()) == 1
    assert reads.count("results.csv") == 1
    store.save_unit({"bits": 2}, [{"value": 2.0}])
    assert store.is_done({"bits": 2}) and reads.count("results.csv") == 2
