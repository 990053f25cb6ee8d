"""experiments/kv_trend.py: paired gaps to the full cache per benchmark and model, from stored runs only."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from experiments.coverage import default_experiment_config
from experiments.io import ResultStore
from experiments.kv_trend import paired_gap, plot_trend, trend_table, write_trend


def test_paired_gap_averages_seeds_first_and_pairs_on_the_keys() -> None:
    rows = pd.DataFrame({"method": ["full", "full", "tq", "tq", "tq", "tq", "tq"],
                         "context": [1, 2, 1, 1, 2, 2, 3],
                         "method_seed": [None, None, 0, 1, 0, 1, 0],
                         "score": [1.0, 1.0, 0.5, 1.0, 0.0, 1.0, 0.0]})
    gap, se, n = paired_gap(rows, "tq", ["context"])
    assert n == 2  # context 3 has no full-cache score to pair with
    assert gap == pytest.approx(-0.375) and se == pytest.approx(0.125)
    assert paired_gap(rows, "absent", ["context"])[2] == 0


def _store(root: Path, experiment: str, model: str, parameters: int, rows: list[dict]) -> None:
    config = {"experiment": default_experiment_config(experiment, "quick"), "scale": {"name": "quick"},
              "model": {"name": model}, "seed": 0}
    store = ResultStore(root, experiment, config, result_keys=["experiment.name", "model", "seed"])
    for i, row in enumerate(rows):
        store.save_unit({"i": i}, [{"model": model, "model_label": model.upper(), **row}])
    store.record_provenance(model={"model": model, "parameters": parameters})


def test_trend_reads_needle_on_handled_contexts_and_ruler_on_every_prompt(tmp_path: Path) -> None:
    needle = [{"method": m, "method_label": m, "paper_method": m, "context": c, "depth": d, "score": s}
              for c, full in ((4000, 1.0), (8000, 0.2)) for d in (0.0, 0.5, 1.0, 0.25, 0.75)
              for m, s in (("full", full), ("turboquant_3p5_window", 0.6 if d < 0.6 else 1.0))]
    _store(tmp_path, "needle", "small", 100, needle)
    ruler = [{"method": m, "method_label": m, "task": "vt", "context": 4096, "sample": i, "score": s}
             for i in range(6) for m, s in (("full", 100.0), ("kivi", 100.0 - 10 * (i % 2)))]
    _store(tmp_path, "ruler", "small", 100, ruler)
    table, coverage = trend_table(tmp_path)
    needle_row = table[(table["benchmark"] == "needle")].set_index("method").loc["turboquant_3p5_window"]
    assert needle_row["pairs"] == 5 and "[4000]" in needle_row["where"]  # 8K: the full cache fails there
    assert needle_row["gap"] == pytest.approx(100 * (3 * -0.4) / 5)
    ruler_row = table[(table["benchmark"] == "RULER")].set_index("method").loc["kivi"]
    assert ruler_row["gap"] == pytest.approx(-5.0) and ruler_row["pairs"] == 6
    assert ruler_row["gap_se"] == pytest.approx(10 * math.sqrt(0.3) / math.sqrt(6))
    assert set(table["parameters"]) == {100.0}
    paths = write_trend(table, coverage, tmp_path / "kv_trend") + plot_trend(table, coverage, tmp_path / "figures")
    assert all(p.stat().st_size > 0 for p in paths)
    assert "No committed rows." in (tmp_path / "kv_trend" / paths[1].name).read_text()  # LongBench-style


def test_a_run_without_a_parameter_count_is_a_clear_error(tmp_path: Path) -> None:
    rows = [{"method": m, "method_label": m, "task": "vt", "context": 4096, "sample": i, "score": 1.0}
            for i in range(6) for m in ("full", "kivi")]
    _store(tmp_path, "ruler", "small", 100, rows)
    record = next((tmp_path / "ruler" / "runs").glob("*.json"))
    record.write_text(record.read_text().replace('"parameters": 100', '"other": 1'))
    with pytest.raises(ValueError, match="no provenance.model.parameters"):
        trend_table(tmp_path)


def test_a_method_keeps_its_colour_in_every_panel(tmp_path: Path, monkeypatch) -> None:
    """A panel without some methods must not hand their colours to the others (the legend is shared)."""
    import matplotlib.pyplot as plt

    from experiments import kv_trend

    needle = [{"method": m, "method_label": m, "paper_method": m, "context": 4000, "depth": d, "score": 1.0}
              for d in (0.0, 0.25, 0.5, 0.75, 1.0) for m in ("full", "turboquant_3p5_window")]
    _store(tmp_path, "needle", "small", 100, needle)
    ruler = [{"method": m, "method_label": m, "task": "vt", "context": 4096, "sample": i, "score": 100.0}
             for i in range(6) for m in ("full", "kivi")]
    _store(tmp_path, "ruler", "small", 100, ruler)
    table, coverage = trend_table(tmp_path)
    drawn = []
    monkeypatch.setattr(kv_trend, "save_figure", lambda fig, *args: drawn.append(fig) or [])
    plot_trend(table, coverage, tmp_path / "figures")
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    seen = {label: handle[0].get_color()
            for ax in drawn[0].axes for handle, label in zip(*ax.get_legend_handles_labels())
            if label in kv_trend.TREND_METHODS}  # the shaded bar has a legend entry too
    assert any("within 2 points" in label for ax in drawn[0].axes for label in ax.get_legend_handles_labels()[1])
    assert seen == {m: colors[kv_trend.TREND_METHODS.index(m) % len(colors)] for m in ("turboquant_3p5_window", "kivi")}


def test_the_bar_verdict_reads_the_95_percent_interval() -> None:
    from experiments.kv_trend import bar_verdict

    assert bar_verdict(-0.94, 0.44) == "within"       # (-1.82, -0.06) inside ±2
    assert bar_verdict(-2.9, 0.8) == "undecided"      # (-4.5, -1.3) straddles -2
    assert bar_verdict(-73.4, 2.0) == "outside"
    assert bar_verdict(0.0, 0.0) == "within"
    assert bar_verdict(1.0, float("nan")) == "undecided"
    assert bar_verdict(-2.5, 0.2) == "outside"
