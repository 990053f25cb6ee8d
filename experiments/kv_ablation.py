"""Why TurboQuant wins or loses the needle: one setting changed at a time, at the same peak memory budget.

Every row is a KV-cache method (``experiment.methods``), run through the needle protocol of
:mod:`experiments.needle` (same prompts, batching, peak memory accounting) on a development grid, over
``experiment.method_seeds`` rotation draws. Per row the table gives

* the needle score, mean over cells and seeds, with the standard error over seeds (the quantizer's random draw);
* the teacher-forced log-probability of the full cache's answer (``answer_logprob``; nats, mean over cells), which
  separates settings before their greedy answers differ, with its standard error over seeds;
* the peak memory ratio (the largest over the cells) and whether it fits ``experiment.memory_ratio``.

The best row within the budget (highest needle score; ties broken by the log-probability) is written as a method
config, ``best_<model>.yaml`` beside the table, to be named as a preset beside the paper's (the paper's preset is
never replaced). A row whose peak memory exceeds the budget is reported, marked, and never chosen.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import yaml

from experiments import needle
from experiments.coverage import frame_coverage
from experiments.io import ResultStore, config_to_dict
from experiments.plotting import figure_style, figure_title, save_figure

RESULT_KEYS = needle.RESULT_KEYS
stored_frame = needle.stored_frame  # the same cells, the same identity

__all__ = ["RESULT_KEYS", "run", "write_tables", "ablation_table", "best_row", "plot"]


def ablation_table(df: pd.DataFrame, budget: float, order: list[str]) -> pd.DataFrame:
    """One row per method: needle score, answer log-probability, peak memory, each with its seed spread."""
    if df.empty:
        raise ValueError("no ablation rows to tabulate")
    logprob = "reference_answer_logprob" in df
    rows = []
    for method in [m for m in order if m in set(df["method"])]:
        cells = df[df["method"] == method]
        peak = float(cells["peak_memory_ratio"].max())
        seeds, score_se = needle.seed_spread(cells)
        rows.append({
            "method": method,
            "label": cells["method_label"].iloc[0],
            "seeds": seeds,
            "cells": len(cells),
            "needle_score": float(cells["score"].mean()),
            "needle_se": score_se,
            "answer_logprob": float(cells["reference_answer_logprob"].mean()) if logprob else float("nan"),
            "answer_logprob_se": needle.seed_spread(cells, "reference_answer_logprob")[1] if logprob else float("nan"),
            "peak_memory_ratio": peak,
            "within_budget": peak <= budget + 1e-9,
            "attention_path": ",".join(sorted(set(cells["attention_path"].astype(str)))),
        })
    return pd.DataFrame(rows)


def best_row(table: pd.DataFrame) -> pd.Series | None:
    """The compressed row within the budget with the highest needle score (then log-probability), if any."""
    candidates = table[table["within_budget"] & (table["peak_memory_ratio"] < 1.0)]
    if candidates.empty:
        return None
    ranked = candidates.assign(_lp=candidates["answer_logprob"].fillna(-np.inf))
    return ranked.sort_values(["needle_score", "_lp"], ascending=False).iloc[0]


def run(cfg: Any, store: ResultStore) -> pd.DataFrame:
    """The needle cells of every row (``experiments.needle.run``), then the ablation table and the best row."""
    frame = needle.run(cfg, store)
    if not frame.empty:
        write_tables(frame, cfg, store.directory)
    return frame


def write_tables(df: pd.DataFrame, cfg: Any, directory: Path) -> None:
    """``ablation_<model>.csv`` / ``.md`` and, when a row fits the budget, ``best_<model>.yaml``; each named
    ``*_partial`` when the rows leave out part of the config's grid (rows or seeds not run, a run cut short)."""
    budget = float(cfg.experiment.memory_ratio)
    table = ablation_table(df, budget, list(cfg.experiment.methods))
    model = str(df["model"].iloc[0])
    coverage = frame_coverage(cfg, df)
    table.to_csv(directory / f"{coverage.stem(f'ablation_{model}')}.csv", index=False)
    reference = table.set_index("method")["needle_score"].get(cfg.experiment.get("reference_row"), np.nan)
    lines = [f"# KV-cache ablation, model {df['model_label'].iloc[0]}", "",
             *([] if coverage.full else [f"**Partial**: not the config's grid ({coverage.summary(limit=10)}).", ""]),
             f"contexts {sorted(int(c) for c in df['context'].unique())} x {df['depth'].nunique()} depths; budget "
             f"{budget:.0%} of the 16-bit cache at its peak; mean +- SE over rotation seeds "
             "(experiments/kv_ablation.py).", "",
             "| row | needle score | Δ vs paper preset | log p(full answer) | peak memory | fits | seeds | path |",
             "|---|---|---|---|---|---|---|---|"]
    for row in table.itertuples():
        se = "" if math.isnan(row.needle_se) else f" ± {row.needle_se:.3f}"
        lp = "" if math.isnan(row.answer_logprob) else f"{row.answer_logprob:.2f}" + (
            "" if math.isnan(row.answer_logprob_se) else f" ± {row.answer_logprob_se:.2f}")
        delta = "" if math.isnan(reference) else f"{row.needle_score - reference:+.3f}"
        lines.append(f"| {row.label} | {row.needle_score:.3f}{se} | {delta} | {lp} | {row.peak_memory_ratio:.3f} | "
                     f"{'yes' if row.within_budget else 'no'} | {row.seeds} | {row.attention_path} |")
    best = best_row(table)
    if best is not None:
        method = config_to_dict(cfg.experiment.methods[best["method"]])
        options = {k: v for k, v in (method.get("options") or {}).items() if k != "seed"}
        preset = {"name": f"turboquant_best_{model}", "label": f"best within {budget:.0%} on {model}: {best['label']}",
                  "cache": str(method["cache"]), "options": {**options, "seed": "${oc.select:seed,0}"}}
        header = (f"# Chosen by experiments/kv_ablation.py: the best row within {budget:.0%} peak memory on {model}\n"
                  f"# (needle {best['needle_score']:.3f}, peak {best['peak_memory_ratio']:.3f}).\n")
        best_name = f"{coverage.stem(f'best_{model}')}.yaml"
        (directory / best_name).write_text(header + yaml.safe_dump(preset, sort_keys=False))
        so_far = "" if coverage.full else " so far"
        lines += ["", f"Best within the budget{so_far}: **{best['label']}** (`{best_name}`)."]
    (directory / f"{coverage.stem(f'ablation_{model}')}.md").write_text("\n".join(lines) + "\n")


def plot(df: pd.DataFrame, cfg: Any, figures_dir: str | Path) -> list[Path]:
    """Needle score and answer log-probability per row, with seed standard errors; over-budget rows hatched."""
    if df.empty:
        raise ValueError("no ablation rows to plot")
    budget = float(cfg.experiment.memory_ratio)
    table = ablation_table(df, budget, list(cfg.experiment.methods))
    provenance = df.attrs.get("provenance", {})
    labels = [textwrap.fill(f"{label} ({100 * peak:.1f}%)", 44) for label, peak in
              zip(table["label"], table["peak_memory_ratio"])]
    y = np.arange(len(table))
    with figure_style():
        fig, axes = plt.subplots(1, 2, figsize=(12, 0.45 * len(table) + 2.2), sharey=True, constrained_layout=True)
        for ax, column, name in ((axes[0], "needle_score", "needle score"),
                                 (axes[1], "answer_logprob", "log p(full cache's answer), nats")):
            bars = ax.barh(y, table[column], xerr=table[column.replace("score", "se") if column == "needle_score"
                                                        else "answer_logprob_se"].fillna(0), color="#4C72B0")
            for bar, fits, peak in zip(bars, table["within_budget"], table["peak_memory_ratio"]):
                if peak >= 1.0:  # the 16-bit reference: no budget applies
                    bar.set_facecolor("#555555")
                elif not fits:
                    bar.set_hatch("//")
                    bar.set_facecolor("#BBBBBB")
            ax.set_xlabel(name)
            ax.invert_yaxis() if ax is axes[0] else None
        axes[0].set_yticks(y, labels)
        axes[0].set_xlim(0, 1.05)
        contexts = ", ".join(f"{int(c) // 1000}K" for c in sorted(df["context"].unique()))
        fig.suptitle(figure_title(f"KV-cache ablation, {contexts} x {df['depth'].nunique()} depths, at {budget:.0%} peak "
                                  "memory (hatched: over budget; dark: the 16-bit cache), mean ± SE over rotation seeds",
                                  provenance))
        return save_figure(fig, figures_dir, f"kv_ablation_{cfg.model.name}", frame_coverage(cfg, df))
