"""Histograms of the inner-product error ⟨y, x̃⟩ − ⟨y, x⟩ over all query × vector pairs (paper Fig. 1).

TurboQuant_prod is unbiased (Theorem 2: E⟨y, x̃⟩ = ⟨y, x⟩), so its histogram is centred at 0 for every b;
TurboQuant_mse is biased towards zero (E⟨y, x̃⟩ ≈ (1 − D_mse)·⟨y, x⟩, e.g. the factor 2/π at b = 1), so
for positively correlated pairs its error is negative, most visibly at b = 1.

Errors are streamed in chunks of pairs into fixed bins ±R_b, R_b = k·√(D_prod upper bound at b) with the
same bins for both methods at a given b, plus exact moments over all pairs and over pairs with
⟨y, x⟩ > 0. Rows: ``record="bin"`` (bin_low, bin_high, count), ``record="summary"`` (one per
``pairs`` subset: n_pairs, mean/std error, slope of error on ⟨y, x⟩, tails outside the bins) and
``record="seed_bias"`` (mean error over a subset of pairs for each of several quantizer seeds).

Unbiasedness is an expectation over the quantizer's randomness (Π, S). Embeddings share a mean
direction, so for one fixed quantizer the errors of all pairs are correlated and their mean is one draw
of a random variable of standard deviation ≈ ‖ȳ‖·‖x̄‖·√(π/(2d))·‖r‖, not 0. The seed_bias rows give its
mean and spread over independent seeds; :func:`bias_in_standard_errors` turns them into a z-score.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd
from tqdm.auto import tqdm

import turboquant as tq
from experiments.coverage import grid_coverage
from experiments.io import ResultStore
from experiments.plotting import METHOD_COLORS, figure_style, figure_title, save_figure
from experiments.quantized_embeddings import (
    METHODS,
    UnitEmbeddings,
    load_unit_embeddings,
    make_quantizer,
    pair_blocks,
    stream_inner_product_errors,
)
from experiments.streaming_stats import FixedBinHistogram, PairMoments

__all__ = [
    "RESULT_KEYS", "run", "plot", "paper_comparison", "error_range", "histogram_rows", "seed_bias_rows",
    "bias_in_standard_errors",
]

#: Config values that change the numbers but are not unit keys (method and bits are; see experiments.io).
RESULT_KEYS = (
    "dataset", "seed", "scale.name", "experiment.sizes", "quantizer.rotation",
    "experiment.n_bins", "experiment.range_in_bound_std", "experiment.bias",
)


def error_range(bits: int, dim: int, range_in_bound_std: float) -> float:
    """Half-width R_b of the histogram: ``range_in_bound_std`` × √(Theorem 2 upper bound on D_prod, ‖y‖ = 1)."""
    if range_in_bound_std <= 0:
        raise ValueError(f"range_in_bound_std must be positive, got {range_in_bound_std}")
    return range_in_bound_std * math.sqrt(tq.bounds.prod_upper_bound(bits, dim, y_norm=1.0))


def histogram_rows(
    quantizer: Any, data: UnitEmbeddings, half_range: float, n_bins: int, pair_chunk: int, desc: str
) -> list[dict[str, Any]]:
    """Stream all pairs through one quantizer; return the bin rows and the summary rows."""
    histogram = FixedBinHistogram(-half_range, half_range, n_bins)
    moments = PairMoments(n_groups=2)  # group 0: ⟨y,x⟩ ≤ 0, group 1: ⟨y,x⟩ > 0
    quantized = quantizer.quantize(data.base)
    blocks = stream_inner_product_errors(quantizer, quantized, data.base, data.queries, pair_chunk)
    total = pair_blocks(data.base.shape[0], data.queries.shape[0], pair_chunk)
    for block in tqdm(blocks, total=total, desc=desc, unit="block", leave=False):
        error = block.error
        histogram.add(error)
        moments.add(block.true, error, group=(block.true > 0))
    edges = histogram.edges
    rows: list[dict[str, Any]] = [
        {"record": "bin", "bin_low": float(lo), "bin_high": float(hi), "count": int(count)}
        for lo, hi, count in zip(edges[:-1], edges[1:], histogram.counts[0])
    ]
    all_pairs = moments.merged()
    rows.append(
        {
            "record": "summary",
            "pairs": "all",
            **all_pairs.summary(),
            "below_range": int(histogram.underflow[0]),
            "above_range": int(histogram.overflow[0]),
        }
    )
    if moments.count(1):
        rows.append({"record": "summary", "pairs": "ip>0", **moments.summary(1)})
    return rows


def seed_bias_rows(
    method: str, bits: int, data: UnitEmbeddings, rotation: str, seeds: list[int], n_base: int, n_queries: int
) -> list[dict[str, Any]]:
    """Mean error over the first ``n_base`` × ``n_queries`` pairs, once per quantizer seed."""
    base, queries = data.base[:n_base], data.queries[:n_queries]
    true = queries.double() @ base.double().T
    rows = []
    for seed in seeds:
        quantizer = make_quantizer(method, data.dim, bits, rotation, seed)
        error = quantizer.inner_product(queries, quantizer.quantize(base)).double() - true
        rows.append({"record": "seed_bias", "quantizer_seed": seed, "mean_error": float(error.mean()),
                     "n_pairs": error.numel()})
    return rows


def bias_in_standard_errors(df: pd.DataFrame, method: str, bits: int) -> dict[str, float] | None:
    """Mean over seeds of the pair-averaged error, its standard error across seeds, and their ratio z."""
    rows = df[(df["record"] == "seed_bias") & (df["method"] == method) & (df["bits"] == bits)]
    if len(rows) < 2:
        return None
    means = rows["mean_error"].to_numpy(dtype=float)
    standard_error = means.std(ddof=1) / math.sqrt(len(means))
    return {"mean": float(means.mean()), "standard_error": standard_error, "seeds": len(means),
            "z": float(means.mean() / standard_error) if standard_error > 0 else math.nan}


def run(cfg: Any, store: ResultStore) -> pd.DataFrame:
    exp = cfg.experiment
    units = [{"method": str(method), "bits": int(bits)} for bits in exp.bits for method in exp.methods]

    def compute(unit: dict, data) -> list[dict]:
        quantizer = make_quantizer(unit["method"], data.dim, unit["bits"], cfg.quantizer.rotation, cfg.seed)
        half_range = error_range(unit["bits"], data.dim, float(exp.range_in_bound_std))
        rows = histogram_rows(
            quantizer, data, half_range, int(exp.n_bins), int(exp.pair_chunk), f"{unit['method']} b={unit['bits']}"
        )
        seeds = [int(cfg.seed) + k for k in range(int(exp.bias.seeds))]
        rows += seed_bias_rows(unit["method"], unit["bits"], data, cfg.quantizer.rotation, seeds,
                               int(exp.bias.n_base), int(exp.bias.n_queries))
        context = {"dim": data.dim, "n_base": int(data.base.shape[0]), "n_queries": int(data.queries.shape[0])}
        return [{**row, **context} for row in rows]

    return store.run_units(units, compute, prepare=lambda _: load_unit_embeddings(cfg, store),
                           progress=lambda data: f"ip_histogram ({data.name}, d={data.dim})")


def _summary(df: pd.DataFrame, method: str, bits: int, pairs: str = "all") -> pd.Series | None:
    rows = df[(df["record"] == "summary") & (df["method"] == method) & (df["bits"] == bits) & (df["pairs"] == pairs)]
    return None if rows.empty else rows.iloc[0]


def _half_width(df: pd.DataFrame, bits: int, spread: float = 5.0) -> float:
    """x-range shown for bit width ``bits``: |mean| + ``spread`` std of the wider method (within the bins)."""
    rows = df[(df["record"] == "summary") & (df["bits"] == bits) & (df["pairs"] == "all")]
    bins = df[(df["record"] == "bin") & (df["bits"] == bits)]
    widest = float((rows["mean_error"].abs() + spread * rows["std_error"]).max())
    return min(widest, float(bins["bin_high"].max()))


def plot(df: pd.DataFrame, cfg: Any, figures_dir: str | Path) -> list[Path]:
    """Fig. 1: one column per b; top row TurboQuant_prod, bottom row TurboQuant_mse; density of the error."""
    if df.empty:
        raise ValueError("no ip_histogram rows to plot")
    provenance = df.attrs.get("provenance", {})
    bits_values = sorted(int(b) for b in df["bits"].unique())
    methods = [m for m in ("prod", "mse") if m in set(df["method"])]
    bins = df[df["record"] == "bin"]
    with figure_style():
        fig, axes = plt.subplots(
            len(methods), len(bits_values), figsize=(2.6 * len(bits_values), 2.3 * len(methods) + 0.6),
            squeeze=False, sharex="col", constrained_layout=True,
        )
        for col, bits in enumerate(bits_values):
            for row, method in enumerate(methods):
                ax = axes[row][col]
                unit = bins[(bins["method"] == method) & (bins["bits"] == bits)].sort_values("bin_low")
                summary = _summary(df, method, bits)
                if unit.empty or summary is None:
                    ax.set_visible(False)
                    continue
                width = unit["bin_high"] - unit["bin_low"]
                density = unit["count"] / (summary["n_pairs"] * width)
                ax.fill_between(unit["bin_low"], density, step="post", color=METHOD_COLORS[method], alpha=0.35)
                ax.step(unit["bin_low"], density, where="post", color=METHOD_COLORS[method], linewidth=0.8)
                positive = _summary(df, method, bits, "ip>0")
                stats = f"mean {summary['mean_error']:+.1e}\nstd {summary['std_error']:.3g}"
                if positive is not None:
                    stats += f"\nmean if ⟨y,x⟩>0: {positive['mean_error']:+.1e}"
                bias = bias_in_standard_errors(df, method, bits)
                if bias is not None:
                    stats += f"\nmean over {bias['seeds']} seeds*: {bias['mean']:+.1e} ± {bias['standard_error']:.0e}"
                ax.text(0.02, 0.97, stats, transform=ax.transAxes, va="top", ha="left", fontsize=7)
                ax.set_ylim(0, 1.9 * float(density.max()))  # headroom for the statistics
                ax.axvline(0.0, color="black", linewidth=0.6, ymax=0.6)  # below the statistics text
                ax.axvline(summary["mean_error"], color=METHOD_COLORS[method], linestyle="--", linewidth=0.8, ymax=0.6)
                ax.set_title(f"{METHODS[method]}, b = {bits}")
                if col == 0:
                    ax.set_ylabel("density")
                if row == len(methods) - 1:
                    ax.set_xlabel(r"error $\langle y,\tilde x\rangle-\langle y,x\rangle$")
            axes[0][col].set_xlim(-_half_width(df, bits), _half_width(df, bits))
        n_pairs = int(_summary(df, methods[0], bits_values[0])["n_pairs"])
        fig.suptitle(figure_title(f"Inner-product error over all {n_pairs:,} query × vector pairs (paper Fig. 1)",
                                  provenance))
        seed_rows = df[df["record"] == "seed_bias"]
        if not seed_rows.empty:
            fig.text(0.5, -0.01, f"* mean error over {int(seed_rows['n_pairs'].iloc[0]):,} pairs, averaged over "
                     "independent quantizer seeds (Π, S) ± its standard error: unbiasedness is an expectation "
                     "over that randomness; histograms use one seed.", ha="center", va="top", fontsize=7)
        return save_figure(fig, figures_dir, f"fig1_ip_histogram_{cfg.dataset.name}", grid_coverage(cfg))


def paper_comparison(df: pd.DataFrame) -> list[dict[str, Any]]:
    """Bias of TurboQuant_prod at b = 1..4 in standard errors across quantizer seeds (Theorem 2: 0)."""
    out = []
    for bits in range(1, 5):
        prod, mse = bias_in_standard_errors(df, "prod", bits), bias_in_standard_errors(df, "mse", bits)
        summary = _summary(df, "prod", bits)
        if prod is None or summary is None:
            continue
        detail = (
            f"mean error over {prod['seeds']} seeds {prod['mean']:+.2e} ± {prod['standard_error']:.1e}; "
            f"one seed over all {int(summary['n_pairs']):,} pairs: {summary['mean_error']:+.2e}"
        )
        if mse is not None:
            detail += f"; TurboQuant_mse for contrast: {mse['mean']:+.2e} (z = {mse['z']:+.0f})"
        out.append({"id": f"ip_histogram.prod_bias_z.b{bits}", "value": prod["z"], "detail": detail})
    return out
