"""The KV-cache ablation: rows through the needle protocol, the table, the best row within the budget."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import yaml
from omegaconf import OmegaConf

from experiments import kv_ablation, needle
from experiments.coverage import frame_coverage
from experiments.data.haystack import Haystack
from experiments.io import ResultStore
from tests.experiments.llm_fixtures import haystack_text, save_tiny_llama

REPO = Path(__file__).resolve().parents[2]

def test_ablation_rows_table_and_best_preset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(needle.experiment, "load_haystack",
                        lambda name: Haystack(haystack_text(400), {"package": "synthetic", "version": "0", "name": name}))
    model_dir = save_tiny_llama(tmp_path / "model")
    seed = "${oc.select:seed,0}"
    cfg = OmegaConf.create({
        "experiment": {
            "name": "kv_ablation", "haystack": "synthetic", "memory_ratio": 0.25, "answer_logprob": True,
            "reference_row": "paper", "method_seeds": [0, 1],
            "task": OmegaConf.to_container(OmegaConf.load(REPO / "configs" / "needle_task" / "sf_sandwich.yaml")),
            "generation": {"max_new_tokens": 3},
            "methods": {
                "full": {"label": "full", "cache": "full", "options": {}},
                "paper": {"label": "3-bit", "cache": "turboquant", "options": {"bits": 3, "seed": seed}},
                "wide": {"label": "4-bit, last layer 16-bit", "cache": "turboquant",
                         "options": {"bits": 4, "fp16_layers": [-1], "seed": seed}},
            },
            "sizes": {"quick": {"contexts": [400], "depths": [0.0, 1.0], "batch_size": 2}},
        },
        "model": {"name": "tiny", "display_name": "tiny", "pretrained": str(model_dir), "dtype": "float32"},
        "scale": {"name": "quick", "device": "cpu"}, "seed": 0,
    })
    store = ResultStore(tmp_path / "results", "kv_ablation", cfg, result_keys=kv_ablation.RESULT_KEYS)
    df = kv_ablation.run(cfg, store)
    stem = frame_coverage(cfg, df).stem  # three methods of the config's thirteen: the files say "partial"
    assert stem("t") == "t_partial" and "**Partial**" in (store.directory / "ablation_tiny_partial.md").read_text()
    table = pd.read_csv(store.directory / f"{stem('ablation_tiny')}.csv")
    assert list(table["method"]) == ["full", "paper", "wide"]
    assert list(table["seeds"]) == [1, 2, 2] and list(table["within_budget"]) == [False, True, False]
    assert table.loc[1, "peak_memory_ratio"] == pytest.approx(df[df["method"] == "paper"]["peak_memory_ratio"].max())
    best = yaml.safe_load((store.directory / f"{stem('best_tiny')}.yaml").read_text())
    assert best["options"]["bits"] == 3 and best["options"]["seed"] == "${oc.select:seed,0}"
    assert "Δ vs paper preset" in (store.directory / f"{stem('ablation_tiny')}.md").read_text()
    paths = kv_ablation.plot(df, cfg, tmp_path / "figures")
    assert all(p.stat().st_size > 0 for p in paths)
    assert kv_ablation.best_row(table.assign(within_budget=False)) is None
