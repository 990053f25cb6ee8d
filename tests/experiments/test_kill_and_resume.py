"""A run killed between two units and started again ends with the uninterrupted run's results, and
recomputes none of the units it had stored: one experiment of each kind (embeddings, ANN, KV cache).

The kill is an exception that is not an ``Exception`` (as a SIGKILL, nothing catches it), raised when the
experiment asks the store to save its (N+1)-th unit, i.e. while that unit is being finished. Every unit an
experiment computes ends in ``save_unit``, so the saves of the two runs tell what each run computed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from omegaconf import OmegaConf, open_dict

from experiments.io import ResultStore

TIMING_COLUMNS = ("train_s", "add_s", "search_s", "seconds")  # prefixes of wall-clock columns (differ between runs)


class Killed(BaseException):
    """What killing the process between two units does to the run."""


def run_killed_then_resumed(monkeypatch: pytest.MonkeyPatch, run: Callable[[ResultStore], pd.DataFrame],
                            kill_after: int) -> tuple[pd.DataFrame, list[str], list[str]]:
    """Run until the ``kill_after + 1``-th save, then again to the end: (final frame, unit ids saved by the
    killed run, unit ids saved by the resumed run)."""
    saved: list[str] = []
    save_unit = ResultStore.save_unit
    kill = {"armed": True}

    def save(store: ResultStore, unit: dict[str, Any], rows: list[dict[str, Any]]) -> None:
        if kill["armed"] and len(saved) == kill_after:
            raise Killed
        save_unit(store, unit, rows)
        saved.append(store.unit_id(unit))

    monkeypatch.setattr(ResultStore, "save_unit", save)
    with pytest.raises(Killed):
        run(None)
    first = list(saved)
    kill["armed"] = False
    frame = run(None)
    return frame, first, saved[len(first):]


def assert_same_results(resumed: pd.DataFrame, uninterrupted: pd.DataFrame) -> None:
    def comparable(frame: pd.DataFrame) -> pd.DataFrame:
        frame = frame.drop(columns=[c for c in frame.columns if c.startswith(TIMING_COLUMNS)])
        return frame.sort_values("unit_id", kind="stable").reset_index(drop=True)
    pd.testing.assert_frame_equal(comparable(resumed), comparable(uninterrupted), check_exact=True)


def check_kill_and_resume(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, experiment: str,
                          run: Callable[[Any, ResultStore], pd.DataFrame], make_cfg: Callable[[Path], Any],
                          result_keys: Any, units: int, kill_after: int) -> None:
    reference_cfg = make_cfg(tmp_path / "uninterrupted")
    uninterrupted = run(reference_cfg, ResultStore(tmp_path / "uninterrupted", experiment, reference_cfg, result_keys))
    cfg = make_cfg(tmp_path / "killed")
    resumed, first, second = run_killed_then_resumed(
        monkeypatch, lambda _: run(cfg, ResultStore(tmp_path / "killed", experiment, cfg, result_keys)), kill_after)
    assert len(first) == kill_after, "the killed run stored the units before the kill"
    assert not set(first) & set(second), "the resumed run recomputed a stored unit"
    assert len(first) + len(second) == units and uninterrupted["unit_id"].nunique() == units
    assert_same_results(resumed, uninterrupted)


# ----------------------------------------------------------------------------------------------- embeddings
def test_distortion_killed_and_resumed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from experiments import distortion
    from tests.experiments.test_distortion_experiments import tiny_config

    check_kill_and_resume(monkeypatch, tmp_path, "distortion", distortion.run,
                          lambda root: tiny_config(root, "distortion", "experiment.bits=[1,2]",
                                                   "experiment.sizes.quick.n_base=300",
                                                   "experiment.sizes.quick.n_queries=10",
                                                   "experiment.quantizer_seeds=[0]"),
                          getattr(distortion, "RESULT_KEYS", None), units=4, kill_after=2)


# ----------------------------------------------------------------------------------------------- ANN
def test_ann_recall_killed_and_resumed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pytest.importorskip("faiss")
    from experiments import ann_recall
    from tests.experiments.test_ann_experiments import _tiny_recall_config

    def make_cfg(root: Path) -> Any:
        cfg = _tiny_recall_config(root)
        with open_dict(cfg):
            cfg.experiment.methods = ["turboquant_mse", "pq"]
            cfg.experiment.sizes.quick = OmegaConf.create({"sphere": {"n_base": 300, "n_queries": 20}})
        return cfg

    check_kill_and_resume(monkeypatch, tmp_path, "ann_recall", ann_recall.run, make_cfg, ann_recall.RESULT_KEYS,
                          units=4, kill_after=2)


# ----------------------------------------------------------------------------------------------- KV cache (needle)
def test_needle_killed_and_resumed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from experiments import needle
    from experiments.data.haystack import Haystack
    from tests.experiments.llm_fixtures import haystack_text, save_tiny_llama
    from tests.experiments.test_needle import _cfg

    model_dir = save_tiny_llama(tmp_path / "model")
    monkeypatch.setattr(needle.experiment, "load_haystack", lambda name: Haystack(
        haystack_text(400), {"package": "synthetic", "version": "0", "name": name}))

    def make_cfg(root: Path) -> Any:
        cfg = _cfg(model_dir, root)
        cfg.experiment.methods = OmegaConf.create({k: cfg.experiment.methods[k] for k in ("full", "tq")})
        cfg.experiment.paper_methods = OmegaConf.create({"full": "full"})
        cfg.experiment.method_seeds = [0]
        cfg.experiment.sizes.quick.contexts = [400]
        return cfg

    check_kill_and_resume(monkeypatch, tmp_path, "needle", needle.run, make_cfg, needle.RESULT_KEYS,
                          units=4, kill_after=2)
