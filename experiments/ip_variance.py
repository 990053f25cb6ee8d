"""Inner-product error bucketed by the true inner product, at one bit width (paper Fig. 2, b = 2).

For TurboQuant_prod the error ⟨y, x̃⟩ − ⟨y, x⟩ is unbiased with variance ≈ (π/(2d))·‖r‖²‖y‖²
(Theorem 2, Lemma 4), which does not depend on ⟨y, x⟩: the per-bucket histograms coincide. For
TurboQuant_mse the error is ≈ −D_mse·⟨y, x⟩ + noise: its mean moves away from 0 as ⟨y, x⟩ grows.

Buckets: the paper's (average inner product ≈ 0.01 .. 0.17) fit OpenAI text-embedding-3 vectors; other
embeddings have other similarity ranges, so the bucket edges are the ``bucket_quantiles`` of this
dataset's inner products, estimated on a seeded sample of pairs, and each bucket is labelled by the
average ⟨y, x⟩ of its pairs, as the paper labels them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator
import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from experiments.coverage import grid_coverage
from experiments.io import ResultStore
from experiments.ip_histogram import error_range
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

__all__ = ["RESULT_KEYS", "run", "plot", "bucket_edges", "bucketed_rows"]

#: Config values that change the numbers but are not unit keys (method and bits are; see experiments.io).
RESULT_KEYS = (
    "dataset", "seed", "scale.name", "experiment.sizes", "quantizer.rotation", "experiment.n_bins",
    "experiment.range_in_bound_std", "experiment.bucket_quantiles", "experiment.quantile_sample_pairs",
)


def bucket_edges(data: UnitEmbeddings, quantiles: list[float], sample_pairs: int, seed: int) -> np.ndarray:
    """Quantiles of ⟨y, x⟩ over all queries × a seeded random subset of ≈ sample_pairs / m vectors."""
    q = np.asarray(quantiles, dtype=np.float64)
    if q.ndim != 1 or q.size < 2 or (np.diff(q) <= 0).any() or q[0] < 0 or q[-1] > 1:
        raise ValueError(f"bucket_quantiles must be ≥ 2 increasing values in [0, 1], got {quantiles}")
    n, m = data.base.shape[0], data.queries.shape[0]
    n_vectors = min(n, max(1, sample_pairs // m))
    generator = torch.Generator().manual_seed(seed)
    subset = torch.randperm(n, generator=generator)[:n_vectors]
    true = (data.queries.double() @ data.base[subset].double().T).numpy().ravel()
    edges = np.quantile(true, q)
    if (np.diff(edges) <= 0).any():
        raise ValueError(f"inner-product quantiles {edges} are not increasing: choose other bucket_quantiles")
    return edges


def bucketed_rows(
    quantizer: Any, data: UnitEmbeddings, edges: np.ndarray, half_range: float, n_bins: int, pair_chunk: int,
    desc: str,
) -> list[dict[str, Any]]:
    """Error histogram and moments of all pairs in each bucket [edges[k], edges[k+1])."""
    n_buckets = len(edges) - 1
    histogram = FixedBinHistogram(-half_range, half_range, n_bins, n_groups=n_buckets)
    moments = PairMoments(n_groups=n_buckets)
    quantized = quantizer.quantize(data.base)
    blocks = stream_inner_product_errors(quantizer, quantized, data.base, data.queries, pair_chunk)
    total = pair_blocks(data.base.shape[0], data.queries.shape[0], pair_chunk)
    for block in tqdm(blocks, total=total, desc=desc, unit="block", leave=False):
        true, error = block.true.ravel(), block.error.ravel()
        bucket = np.searchsorted(edges, true, side="right") - 1  # k: edges[k] <= t < edges[k+1]
        inside = (bucket >= 0) & (bucket < n_buckets)
        histogram.add(error[inside], group=bucket[inside])
        moments.add(true[inside], error[inside], group=bucket[inside])
    rows: list[dict[str, Any]] = []
    bin_edges = histogram.edges
    for k in range(n_buckets):
        if moments.count(k) == 0:
            raise ValueError(f"bucket [{edges[k]:.4f}, {edges[k + 1]:.4f}) received no pairs")
        bucket_info = {"bucket": k, "bucket_low": float(edges[k]), "bucket_high": float(edges[k + 1])}
        rows += [
            {"record": "bin", **bucket_info, "bin_low": float(lo), "bin_high": float(hi), "count": int(c)}
            for lo, hi, c in zip(bin_edges[:-1], bin_edges[1:], histogram.counts[k])
        ]
        rows.append(
            {
                "record": "summary",
                **bucket_info,
                **moments.summary(k),
                "below_range": int(histogram.underflow[k]),
                "above_range": int(histogram.overflow[k]),
            }
        )
    return rows


def run(cfg: Any, store: ResultStore) -> pd.DataFrame:
    exp = cfg.experiment
    bits = int(exp.bits)
    units = [{"method": str(method), "bits": bits} for method in exp.methods]

    def prepare(_) -> tuple:
        data = load_unit_embeddings(cfg, store)
        edges = bucket_edges(data, list(exp.bucket_quantiles), int(exp.quantile_sample_pairs), int(cfg.seed))
        return data, edges

    def compute(unit: dict, prepared: tuple) -> list[dict]:
        data, edges = prepared
        half_range = error_range(bits, data.dim, float(exp.range_in_bound_std))
        context = {"dim": data.dim, "n_base": int(data.base.shape[0]), "n_queries": int(data.queries.shape[0])}
        quantizer = make_quantizer(unit["method"], data.dim, bits, cfg.quantizer.rotation, cfg.seed)
        rows = bucketed_rows(
            quantizer, data, edges, half_range, int(exp.n_bins), int(exp.pair_chunk), f"{unit['method']} b={bits}"
        )
        return [{**row, **context} for row in rows]

    return store.run_units(units, compute, prepare=prepare,
                           progress=lambda prepared: f"ip_variance ({prepared[0].name}, d={prepared[0].dim})")


def plot(df: pd.DataFrame, cfg: Any, figures_dir: str | Path) -> list[Path]:
    """Fig. 2: error density per bucket for each method, and mean ± std of the error vs average ⟨y, x⟩."""
    if df.empty:
        raise ValueError("no ip_variance rows to plot")
    provenance = df.attrs.get("provenance", {})
    bits = int(df["bits"].iloc[0])
    methods = [m for m in ("prod", "mse") if m in set(df["method"])]
    summaries = df[df["record"] == "summary"]
    bins = df[df["record"] == "bin"]
    n_buckets = int(summaries["bucket"].max()) + 1
    colors = plt.get_cmap("viridis")(np.linspace(0.0, 0.9, n_buckets))
    # the x-range shown: |mean| + 5 std of the widest bucket, within the histogram's bins
    half_width = min(float((summaries["mean_error"].abs() + 5 * summaries["std_error"]).max()),
                     float(bins["bin_high"].max()))
    with figure_style():
        fig, axes = plt.subplots(1, len(methods) + 1, figsize=(3.3 * (len(methods) + 1), 3.4), constrained_layout=True)
        for ax, method in zip(axes, methods):
            for k in range(n_buckets):
                summary = summaries[(summaries["method"] == method) & (summaries["bucket"] == k)].iloc[0]
                unit = bins[(bins["method"] == method) & (bins["bucket"] == k)].sort_values("bin_low")
                density = unit["count"] / (summary["n_pairs"] * (unit["bin_high"] - unit["bin_low"]))
                ax.step(unit["bin_low"], density, where="post", color=colors[k],
                        label=f"avg ⟨y,x⟩ = {summary['mean_true_ip']:.3f}")
            ax.axvline(0.0, color="black", linewidth=0.6)
            ax.set_xlim(-half_width, half_width)
            ax.xaxis.set_major_locator(MaxNLocator(5))
            ax.set_title(f"{METHODS[method]}, b = {bits}")
            ax.set_xlabel(r"error $\langle y,\tilde x\rangle-\langle y,x\rangle$")
            ax.set_ylabel("density")
        ax = axes[-1]
        for method in methods:
            rows = summaries[summaries["method"] == method].sort_values("bucket")
            ax.errorbar(rows["mean_true_ip"], rows["mean_error"], yerr=rows["std_error"], fmt="o-", capsize=3,
                        color=METHOD_COLORS[method], label=f"{METHODS[method]} mean ± std")
        ax.axhline(0.0, color="black", linewidth=0.6)
        ax.set_xlabel(r"average inner product $\langle y,x\rangle$ of the bucket")
        ax.set_ylabel("inner-product error")
        ax.set_title("bias and spread per bucket")
        low = float((summaries["mean_error"] - summaries["std_error"]).min())
        high = float((summaries["mean_error"] + summaries["std_error"]).max())
        ax.set_ylim(low - 0.05 * (high - low), high + 0.7 * (high - low))  # room for the legend above the bars
        ax.legend(loc="upper right")
        ax.xaxis.set_major_locator(MaxNLocator(5))
        handles, labels = axes[0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside lower center", ncol=n_buckets,
                   title="buckets of pairs by their inner product (labelled by the bucket's average)")
        fig.suptitle(figure_title(f"Inner-product error by similarity bucket, b = {bits} (paper Fig. 2)", provenance))
        return save_figure(fig, figures_dir, f"fig2_ip_variance_{cfg.dataset.name}", grid_coverage(cfg))
