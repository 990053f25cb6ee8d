"""The KV-cache verdicts against model size: each method's gap to the full cache on the needle, RULER and the
LongBench-style tasks, per shipped model (issue 18's trend), read from the committed runs, computing nothing.

For one benchmark, model and method the gap is the mean of paired differences (method - full cache) on the
prompts both scored, the method's score first averaged over its rotation seeds, with the standard error of those
differences (the prompts' difficulty cancels):

* needle: one pair per (context, depth) cell, on the contexts the model handles (the full cache scores
  >= :data:`experiments.needle.table.HANDLED_SCORE` there; elsewhere the needle is not a ceiling test), x 100;
* RULER: one pair per (task, context, sample), every stored context (scores 0-100);
* LongBench-style: one pair per (task, sample, context budget), x 100.

Each gap carries issue 18's verdict on "within 0.02 of full" (:data:`BAR_POINTS` = 2 points on these 0-100
scales), read off the gap's 95% interval (± 2 paired SE): ``within`` when the whole interval lies inside ± 2 points,
``outside`` when it lies wholly beyond them, ``undecided`` when it straddles the bar (more pairs would decide).

Per (experiment, model) the most recently updated run with full-cache rows counts (as in
:mod:`experiments.compare`); runs on random weights (the paper-scale dry run) are not scores of a model. A gap that rests on fewer than
:data:`MIN_PAIRS` pairs is left out.

    python scripts/kv_trend.py        # results/kv_trend/summary_kv_trend.{csv,md}, figures/kv_trend.png
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from omegaconf import OmegaConf

from experiments.compare import ExperimentRun, load_runs
from experiments.coverage import GridCoverage
from experiments.needle.table import HANDLED_SCORE, handled_contexts
from experiments.plotting import figure_style, save_figure

__all__ = ["BAR_POINTS", "BENCHMARKS", "TREND_METHODS", "MIN_PAIRS", "bar_verdict", "paired_gap", "trend_table",
           "write_trend", "plot_trend"]

#: benchmark -> (experiment, pairing keys, score scale to points)
BENCHMARKS: dict[str, tuple[str, tuple[str, ...], float]] = {
    "needle": ("needle", ("context", "depth"), 100.0),
    "RULER": ("ruler", ("task", "context", "sample"), 1.0),
    "LongBench-style": ("longbench", ("task", "sample_id", "context_budget"), 100.0),
}
#: the methods of the trend (config keys): the paper's presets, the ablation's best presets, vLLM's, KIVI
TREND_METHODS = ("turboquant_3p5_window", "turboquant_2p5_window", "turboquant_3p5_window_centered",
                 "turboquant_3p5_window_layer0", "turboquant_4bit_nc", "kivi")
FULL = "full"
MIN_PAIRS = 5
#: issue 18's bar for "matches the full cache": within 0.02 of it, i.e. 2 points on a 0-100 scale
BAR_POINTS = 2.0
_MARKS = {"within": "✓", "outside": "✗", "undecided": "?"}
_METHOD_CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "method"


def paired_gap(rows: pd.DataFrame, method: str, keys: Sequence[str], reference: str = FULL) -> tuple[float, float, int]:
    """``(mean, standard error, pairs)`` of ``method - reference`` over the ``keys`` both scored (``score``
    averaged over seeds per key first); NaN mean with no pair, NaN SE with one."""
    per_key = rows[rows["method"].isin([method, reference])].groupby(["method", *keys])["score"].mean()
    if method not in per_key.index.get_level_values(0) or reference not in per_key.index.get_level_values(0):
        return float("nan"), float("nan"), 0
    diff = (per_key.loc[method] - per_key.loc[reference]).dropna()
    n = len(diff)
    se = float(diff.std(ddof=1) / math.sqrt(n)) if n > 1 else float("nan")
    return (float(diff.mean()) if n else float("nan")), se, n


def bar_verdict(gap: float, se: float, bar: float = BAR_POINTS) -> str:
    """``within`` when gap ± 2 SE lies inside ± ``bar``, ``outside`` when it lies wholly beyond it, else
    ``undecided`` (an SE of NaN, from a single pair, decides nothing)."""
    if not math.isfinite(se):
        return "undecided"
    if abs(gap) + 2 * se <= bar:
        return "within"
    if abs(gap) - 2 * se > bar:
        return "outside"
    return "undecided"


def _parameters(run: ExperimentRun) -> float:
    """The model's parameter count as :func:`experiments.models.load_model` recorded it in the run's provenance."""
    value = (run.provenance.get("model") or {}).get("parameters")
    if value is None:
        raise ValueError(f"run {run.label}: its record has no provenance.model.parameters (load_model records it; "
                         "rerun the experiment to record it)")
    return float(value)


def _label(method: str) -> str:
    """The method's label as its config file names it now (stored rows keep the label of their day)."""
    return str(OmegaConf.load(_METHOD_CONFIGS / f"{method}.yaml").label)


def _latest_per_model(runs: Sequence[ExperimentRun], experiment: str) -> dict[str, ExperimentRun]:
    latest: dict[str, ExperimentRun] = {}
    for run in sorted((r for r in runs if r.experiment == experiment), key=lambda r: r.updated):
        if run.provenance.get("model", {}).get("source") == "random_weights" or run.frame.empty:
            continue
        if not (run.frame["method"] == FULL).any():
            continue  # no full-cache rows to pair with (e.g. a run of the unwindowed presets' bytes alone)
        for model in run.frame["model"].dropna().unique():
            latest[str(model)] = run
    return latest


def trend_table(results_dir: str | Path) -> tuple[pd.DataFrame, GridCoverage]:
    """One row per (benchmark, model, method) with a gap (parameters, gap, gap_se, pairs, the run, where), and
    the coverage of the runs it read: what each left out of its config's grid (empty when all are full runs)."""
    runs = load_runs(results_dir)
    rows = []
    used: dict[str, ExperimentRun] = {}
    for benchmark, (experiment, keys, scale) in BENCHMARKS.items():
        for model, run in _latest_per_model(runs, experiment).items():
            frame = run.frame[run.frame["model"] == model]
            where = "every stored prompt"
            if benchmark == "needle":
                handled = handled_contexts(frame)
                frame = frame[frame["context"].isin(handled)]
                where = f"contexts the full cache handles: {handled}"
            for method in TREND_METHODS:
                gap, se, n = paired_gap(frame, method, keys)
                if n < MIN_PAIRS:
                    continue
                used[run.label] = run
                rows.append({"benchmark": benchmark, "model": model, "model_label": frame["model_label"].iloc[0],
                             "parameters": _parameters(run), "method": method, "method_label": _label(method),
                             "gap": gap * scale, "gap_se": se * scale, "pairs": n,
                             "within_2_points": bar_verdict(gap * scale, se * scale), "run": run.label, "where": where})
    columns = ["benchmark", "model", "model_label", "parameters", "method", "method_label", "gap", "gap_se", "pairs",
               "within_2_points", "run", "where"]
    table = pd.DataFrame(rows, columns=columns).sort_values(["benchmark", "parameters", "method"], kind="stable")
    return table, GridCoverage(tuple(r for run in used.values() for r in run.coverage.reduced))


def write_trend(table: pd.DataFrame, coverage: GridCoverage, directory: str | Path) -> list[Path]:
    """``summary_kv_trend.csv`` (every row) and ``.md`` (gap ± paired SE per benchmark, method x model);
    ``summary_kv_trend_partial.*`` when a run it read left out part of its grid."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    stem = coverage.stem("summary_kv_trend")
    csv_path, md_path = directory / f"{stem}.csv", directory / f"{stem}.md"
    table.to_csv(csv_path, index=False)
    title = coverage.title('KV-cache gap to the full cache vs model size (experiments/kv_trend.py)')
    lines = ["# " + title.replace("\n", " — "), "",
             "Points (score x 100 for the needle and LongBench-style), method - full cache on the same prompts, "
             "± paired SE, [pairs]; per model the latest committed run. Needle: only the contexts where the full "
             f"cache scores >= {HANDLED_SCORE}. A blank cell: no committed run, or fewer than {MIN_PAIRS} pairs.",
             "", f"Within {BAR_POINTS:g} points of the full cache (issue 18's 0.02), by the gap ± 2 paired SE: ✓ the "
             "whole interval inside, ✗ wholly outside, ? it straddles the bar.", ""]
    for benchmark in BENCHMARKS:
        rows = table[table["benchmark"] == benchmark]
        lines.append(f"## {benchmark}")
        if rows.empty:
            lines += ["", "No committed rows.", ""]
            continue
        models = rows.drop_duplicates("model").sort_values("parameters")
        lines += ["", "| method | " + " | ".join(models["model_label"].str.split(" \\(").str[0]) + " |",
                  "|---|" + "---|" * len(models)]
        for method in TREND_METHODS:
            cells = []
            for model in models["model"]:
                hit = rows[(rows["method"] == method) & (rows["model"] == model)]
                cells.append("" if hit.empty else
                             f"{hit['gap'].iloc[0]:+.1f} ± {hit['gap_se'].iloc[0]:.1f} [{hit['pairs'].iloc[0]}] "
                             f"{_MARKS[hit['within_2_points'].iloc[0]]}")
            if any(cells):
                label = rows.loc[rows["method"] == method, "method_label"].iloc[0]
                lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines += ["", "Runs: " + ", ".join(sorted(set(rows["run"]))) + "; " + "; ".join(
            f"{m}: {w}" for m, w in rows.drop_duplicates("model")[["model", "where"]].itertuples(index=False)), ""]
    md_path.write_text("\n".join(lines))
    return [csv_path, md_path]


def plot_trend(table: pd.DataFrame, coverage: GridCoverage, figures_dir: str | Path) -> list[Path]:
    """One panel per benchmark: gap ± paired SE against parameters (log axis), one line per method, the band of
    ± :data:`BAR_POINTS` shaded."""
    if table.empty:
        raise ValueError("no committed needle / RULER / LongBench-style rows with a full-cache reference")
    with figure_style():
        fig, axes = plt.subplots(1, len(BENCHMARKS), figsize=(4.2 * len(BENCHMARKS), 3.8), squeeze=False,
                                 constrained_layout=True)
        colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]  # one colour per method in every panel
        span = (table["parameters"].min() / 10 ** 0.15, table["parameters"].max() * 10 ** 0.15)  # shared x range
        offsets = np.linspace(-0.04, 0.04, len(TREND_METHODS))  # methods side by side at one model
        for ax, benchmark in zip(axes[0], BENCHMARKS):
            rows = table[table["benchmark"] == benchmark]
            for index, (offset, method) in enumerate(zip(offsets, TREND_METHODS)):
                hit = rows[rows["method"] == method].sort_values("parameters")
                if hit.empty:
                    continue
                ax.errorbar(hit["parameters"] * 10 ** offset, hit["gap"], yerr=hit["gap_se"], marker="o", capsize=3,
                            color=colors[index % len(colors)],
                            label=method)  # the method's config name: its label does not fit a legend
            ax.axhline(0, color="k", lw=0.8)
            ax.axhspan(-BAR_POINTS, BAR_POINTS, color="0.85", zorder=0,
                       label=f"within {BAR_POINTS:g} points (issue 18's 0.02)")
            ax.set_xscale("log")
            ax.set_xlim(*span)
            ax.set(xlabel="parameters", ylabel="gap to the full cache (points)", title=benchmark)
            if rows.empty:
                ax.text(0.5, 0.5, "no committed rows", ha="center", va="center", transform=ax.transAxes)
                ax.set(xticks=[], yticks=[])
        fig.legend(*max((a.get_legend_handles_labels() for a in axes[0]), key=lambda hl: len(hl[0])),
                   loc="outside lower center", ncol=3, fontsize=7)
        models = ", ".join(table.drop_duplicates("model").sort_values("parameters")["model_label"].str.split(" \\(")
                           .str[0])
        fig.suptitle("KV caches at 25% memory: gap to the full cache vs model size (stand-ins for Llama-3.1-8B: "
                     f"{models})", fontsize=9)
        return save_figure(fig, figures_dir, "kv_trend", coverage)
