"""Fig. 4: one heatmap per method (context on x, depth on y, shared 0-1 colour scale)."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.colors import LinearSegmentedColormap

from experiments.coverage import frame_coverage
from experiments.needle.table import context_label, method_order, seed_spread
from experiments.plotting import figure_style, figure_title, save_figure

#: Red (miss) - yellow - green (found), the palette of the Fu et al. / Kamradt heatmaps.
NEEDLE_CMAP = LinearSegmentedColormap.from_list("needle", ["#F0496E", "#EBB839", "#0CD79F"])


def plot(df: pd.DataFrame, cfg: Any, figures_dir: str | Path) -> list[Path]:
    """One heatmap per method (context on x, depth on y, shared 0-1 colour scale), mean score in the title."""
    if df.empty:
        raise ValueError("no needle rows to plot")
    provenance = df.attrs.get("provenance", {})
    methods = method_order(df, list(cfg.experiment.methods))
    contexts = sorted(int(c) for c in df["context"].unique())
    depths = sorted(float(d) for d in df["depth"].unique())
    ncols = min(4, len(methods))
    nrows = math.ceil(len(methods) / ncols)
    annotate = len(contexts) * len(depths) <= 120
    with figure_style():
        fig, axes = plt.subplots(
            nrows, ncols, figsize=(3.0 * ncols + 0.8, 2.8 * nrows + 1.0), squeeze=False, constrained_layout=True
        )
        image = None
        for ax, method in zip(axes.flat, methods):
            rows = df[df["method"] == method]
            grid = rows.pivot_table(index="depth", columns="context", values="score", aggfunc="mean")
            grid = grid.reindex(index=depths, columns=contexts)
            image = ax.imshow(grid.to_numpy(), cmap=NEEDLE_CMAP, vmin=0.0, vmax=1.0, aspect="auto")
            ax.set_xticks(range(len(contexts)), [context_label(c) for c in contexts])
            ax.set_yticks(range(len(depths)), [f"{100 * d:g}%" for d in depths])
            ax.grid(False)
            if annotate:
                for (i, j), value in np.ndenumerate(grid.to_numpy()):
                    if not np.isnan(value):
                        ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=6)
            label = rows["method_label"].iloc[0]
            bits = rows["bits_per_value"].mean()
            ratio = rows["peak_memory_ratio"].max() if "peak_memory_ratio" in rows else rows["memory_ratio"].mean()
            seeds, se = seed_spread(rows)
            score = f"{rows['score'].mean():.3f}" + (f" ± {se:.3f} ({seeds} seeds)" if seeds > 1 else "")
            over = " (over budget)" if ratio > float(cfg.experiment.memory_ratio) + 1e-9 and ratio < 1 else ""
            ax.set_title(f"{textwrap.fill(label, 34)}\nmean {score}\n{bits:.2f} bits, peak {100 * ratio:.1f}% of 16-bit{over}")
            ax.set_xlabel("context length (tokens)")
            ax.set_ylabel("needle depth")
        for ax in list(axes.flat)[len(methods) :]:
            ax.set_visible(False)
        fig.colorbar(image, ax=axes, shrink=0.8, label="score")
        budget = float(cfg.experiment.memory_ratio)
        fig.suptitle(
            figure_title(
                f"Needle-in-a-haystack (paper Fig. 4), memory budget {100 * budget:g}% of the 16-bit KV cache at its "
                "peak (measured bits and peak % per panel)",
                provenance,
            )
        )
        return save_figure(fig, figures_dir, f"fig4_needle_{cfg.model.name}", frame_coverage(cfg, df))
