"""Two disputes about TurboQuant's quantizers, measured at equal stored bits over several quantizer seeds.

1. **Scale** (DRIVE/EDEN authors, arXiv 2604.18555): TurboQuant_mse is EDEN with its scale fixed at 1.
   With x̂ = ‖x‖·Πᵀc[idx] TurboQuant_mse's reconstruction, EDEN stores one scale per vector in place of
   the norm (same bits) and reconstructs x̃ = s·x̂/‖x‖ with

       s = ‖x‖² / ⟨x, x̂/‖x‖⟩         (``eden_unbiased``: E⟨y, x̃⟩ = ⟨y, x⟩ over the rotation)
       s = ⟨x, x̂⟩ / ‖x̂/‖x‖‖² / ‖x‖  (``eden_mse``: the least-squares scale, minimising ‖x − x̃‖²)

   against TurboQuant_mse (``mse``, s = ‖x‖) and TurboQuant_prod (``prod``: (b−1)-bit MSE stage + 1-bit
   QJL of the residual + its norm) at the same b. Their claim: "2-bit EDEN beats 3-bit TurboQuant_prod"
   on inner products.
2. **Rotation**: the paper's Π is Haar (QR of a Gaussian matrix); the randomized Hadamard transform is the
   usual O(d log d) substitute. Is it one for quality too (D_mse, D_prod, recall), not only for time?

Per (method, rotation, b, quantizer seed), on unit base vectors x and unit queries y (all pairs):
D_mse = E‖x − x̃‖², d·D_prod = d·E(⟨y, x⟩ − est)², the mean error (bias), and recall@1@k: how often the
true top-1 inner-product neighbour of a query is among the k best estimates. The spread over seeds is the
quantizer's own randomness (Π, S); the data are fixed.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from experiments.coverage import grid_coverage
from experiments.io import ResultStore
from experiments.plotting import METHOD_COLORS, figure_style, figure_title, save_figure
from experiments.quantized_embeddings import UnitEmbeddings, load_unit_embeddings, make_quantizer

__all__ = ["METHODS", "RESULT_KEYS", "eden_scales", "measure", "run", "seed_summary", "plot", "paper_comparison"]

RESULT_KEYS = ("dataset", "seed", "scale.name", "experiment.sizes", "experiment.recall_k")

#: Method names of the config and the rows, with their legend labels.
METHODS: dict[str, str] = {"mse": "TurboQuant_mse (scale 1)", "eden_unbiased": "EDEN, unbiased scale",
                           "eden_mse": "EDEN, least-squares scale", "prod": "TurboQuant_prod"}
_COLORS = {**METHOD_COLORS, "eden_unbiased": "#2ca02c", "eden_mse": "#ff7f0e"}


def eden_scales(x: torch.Tensor, x_hat: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-row factor f with x̃ = f·x̂ (x̂ TurboQuant_mse's reconstruction): ``eden_unbiased``
    ‖x‖²/⟨x, x̂⟩, ``eden_mse`` ⟨x, x̂⟩/‖x̂‖²; float64, shape (n,)."""
    x, x_hat = x.double(), x_hat.double()
    dot = (x * x_hat).sum(dim=1)
    if kind == "eden_unbiased":
        return (x * x).sum(dim=1) / dot
    if kind == "eden_mse":
        return dot / (x_hat * x_hat).sum(dim=1)
    raise ValueError(f"unknown EDEN scale {kind!r}; expected eden_unbiased or eden_mse")


def _recall_at(scores: torch.Tensor, truth: torch.Tensor, k: int) -> float:
    """Fraction of queries whose true top-1 index is among the ``k`` largest estimated scores."""
    top = scores.topk(min(k, scores.shape[1]), dim=1).indices
    return float((top == truth[:, None]).any(dim=1).double().mean())


def measure(rotation: str, bits: int, seed: int, data: UnitEmbeddings, methods: list[str],
            recall_k: list[int]) -> list[dict[str, Any]]:
    """One row per method of one quantizer draw: D_mse, d·D_prod, bias, stored bits per coordinate and
    recall@1@k. TurboQuant_mse and both EDEN scales share one set of codes (EDEN only rescales)."""
    queries, base = data.queries.double(), data.base.double()
    true = queries @ base.T
    truth = true.argmax(dim=1)
    rows = []
    for kind in ("mse", "prod"):
        members = [m for m in methods if (m == "prod") == (kind == "prod")]
        if not members:
            continue
        quantizer = make_quantizer(kind, data.dim, bits, rotation, seed)
        codes = quantizer.quantize(data.base)
        x_hat = quantizer.dequantize(codes).double()
        estimates = quantizer.inner_product(data.queries, codes).double()
        for method in members:
            factor = eden_scales(base, x_hat, method) if method.startswith("eden") else torch.ones(len(base), dtype=torch.float64)
            error = estimates * factor[None, :] - true
            rows.append({
                "method": method,
                "d_mse": float(((base - x_hat * factor[:, None]) ** 2).sum(dim=1).mean()),
                "d_prod_times_d": float((error**2).mean()) * data.dim,
                "mean_ip_error": float(error.mean()),
                "bits_per_coordinate": codes.bits_per_coordinate,  # EDEN's scale takes the norm's place: same bits
                **{f"recall_at_{k}": _recall_at(estimates * factor[None, :], truth, k) for k in recall_k},
                "dim": data.dim,
                "n_base": int(base.shape[0]),
                "n_queries": int(queries.shape[0]),
            })
    return rows


def run(cfg: Any, store: ResultStore) -> pd.DataFrame:
    """Every (rotation, bits, quantizer seed) unit not yet in the store (one row per method); this run's rows."""
    exp = cfg.experiment
    methods = [str(m) for m in exp.methods]
    unknown = set(methods) - set(METHODS)
    if unknown:
        raise ValueError(f"unknown methods {sorted(unknown)}; expected some of {sorted(METHODS)}")
    units = [{"rotation": str(r), "bits": int(b), "quantizer_seed": int(s), "methods": ",".join(methods)}
             for r in exp.rotations for b in exp.bits for s in exp.seeds]
    todo = [unit for unit in units if not store.is_done(unit)]
    if todo:
        torch.set_num_threads(int(exp.threads))
        data = load_unit_embeddings(cfg)
        store.record_provenance(**data.provenance())
        for unit in tqdm(todo, desc=f"quantizer disputes ({data.name}, d={data.dim})", unit="unit"):
            store.save_unit(unit, measure(unit["rotation"], unit["bits"], unit["quantizer_seed"], data, methods,
                                          [int(k) for k in exp.recall_k]))
    return store.frame(units)


def seed_summary(df: pd.DataFrame, column: str) -> pd.DataFrame:
    """Mean of ``column`` over quantizer seeds and its standard error, per (method, rotation, bits)."""
    grouped = df.groupby(["method", "rotation", "bits"])[column]
    out = grouped.agg(["mean", "std", "count"]).reset_index()
    out["se"] = out["std"] / np.sqrt(out["count"])
    return out


def _paired(df: pd.DataFrame, column: str, num: dict[str, Any], den: dict[str, Any],
            ratio: bool = True) -> tuple[float, float, int]:
    """Mean and standard error over quantizer seeds of column(num) / column(den) (``ratio=False``: the
    difference), paired by seed; and the number of seeds."""
    def pick(keys: dict[str, Any]) -> pd.Series:
        rows = df[np.logical_and.reduce([df[k] == v for k, v in keys.items()])]
        return rows.set_index("quantizer_seed")[column]

    paired = ((pick(num) / pick(den)) if ratio else (pick(num) - pick(den))).dropna()
    n = len(paired)
    return (float(paired.mean()) if n else math.nan, float(paired.std(ddof=1) / math.sqrt(n)) if n > 1 else math.nan, n)


def paper_comparison(df: pd.DataFrame) -> list[dict[str, Any]]:
    """The disputes' check rows (experiments/paper_numbers.yaml, table "disputes"), each a mean over
    quantizer seeds, paired by seed, with its standard error."""
    out = []

    def add(key: str, stats: tuple[float, float, int], what: str) -> None:
        value, se, n = stats
        if n:
            out.append({"id": f"disputes.{key}", "value": value, "se": se, "detail": f"{what}, {n} quantizer seeds"})

    for b in sorted(df["bits"].unique()):
        b = int(b)
        haar = {"rotation": "haar", "bits": b}
        add(f"eden_unbiased_vs_mse.d_prod.b{b}", _paired(df, "d_prod_times_d", {**haar, "method": "eden_unbiased"},
                                                                {**haar, "method": "mse"}),
            f"d·D_prod EDEN (unbiased scale) / TurboQuant_mse, b={b}, Haar")
        add(f"eden_mse_vs_mse.d_mse.b{b}", _paired(df, "d_mse", {**haar, "method": "eden_mse"}, {**haar, "method": "mse"}),
            f"D_mse EDEN (least-squares scale) / TurboQuant_mse, b={b}, Haar")
        for method, column in (("mse", "d_mse"), ("prod", "d_prod_times_d")):
            add(f"hadamard_vs_haar.{column}.b{b}",
                _paired(df, column, {"method": method, "rotation": "hadamard", "bits": b},
                              {"method": method, "rotation": "haar", "bits": b}),
                f"{column} of {METHODS[method]}, randomized Hadamard / Haar, b={b}")
        add(f"hadamard_vs_haar.recall_at_1.b{b}",
            _paired(df, "recall_at_1", {"method": "mse", "rotation": "hadamard", "bits": b},
                    {"method": "mse", "rotation": "haar", "bits": b}, ratio=False),
            f"recall@1@1 of TurboQuant_mse, randomized Hadamard − Haar, b={b}")
    add("eden_2bit_vs_prod_3bit", _paired(df, "d_prod_times_d", {"method": "eden_unbiased", "rotation": "haar", "bits": 2},
                                                {"method": "prod", "rotation": "haar", "bits": 3}),
        "d·D_prod 2-bit EDEN (unbiased scale) / 3-bit TurboQuant_prod, Haar")
    return out


def plot(df: pd.DataFrame, cfg: Any, figures_dir: str | Path) -> list[Path]:
    """(a) d·D_prod and (b) D_mse against b per method (Haar), (c) Hadamard / Haar of each; ± SE over seeds."""
    if df.empty:
        raise ValueError("no quantizer-dispute rows to plot")
    provenance = df.attrs.get("provenance", {})
    seeds = int(df.groupby(["method", "rotation", "bits"]).size().min())  # one row per method and draw
    with figure_style():
        fig, axes = plt.subplots(1, 3, figsize=(13, 3.9), constrained_layout=True)
        for ax, column, label in ((axes[0], "d_prod_times_d", r"$d\cdot D_{prod}$"), (axes[1], "d_mse", r"$D_{mse}$")):
            summary = seed_summary(df[df["rotation"] == "haar"], column)
            for method, part in summary.groupby("method", sort=False):
                ax.errorbar(part["bits"], part["mean"], yerr=part["se"], marker="o", capsize=3,
                            color=_COLORS.get(method), label=METHODS.get(method, method))
            ax.set_yscale("log")
            ax.set_xlabel("bits per coordinate b")
            ax.set_ylabel(label)
            ax.set_xticks(sorted(df["bits"].unique()))
        axes[0].set_title("(a) inner-product error, Haar rotation")
        axes[1].set_title("(b) mean squared error, Haar rotation")
        axes[0].legend()
        ax = axes[2]
        for method, column, marker in (("mse", "d_mse", "o"), ("prod", "d_prod_times_d", "s")):
            bits = sorted(df["bits"].unique())
            stats = [_paired(df, column, {"method": method, "rotation": "hadamard", "bits": b},
                                   {"method": method, "rotation": "haar", "bits": b}) for b in bits]
            ax.errorbar(bits, [s[0] for s in stats], yerr=[s[1] for s in stats], marker=marker, capsize=3,
                        color=_COLORS[method], label=f"{METHODS[method]}: {column}")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(sorted(df["bits"].unique()))
        ax.set_xlabel("bits per coordinate b")
        ax.set_ylabel("randomized Hadamard / Haar")
        ax.set_title("(c) rotation: Hadamard vs the paper's Haar")
        ax.legend()
        fig.suptitle(figure_title(f"Disputes at equal stored bits: EDEN's scale and the rotation (mean ± SE over "
                                  f"{seeds} quantizer seeds)", provenance))
        return save_figure(fig, figures_dir, f"disputes_quantizers_{cfg.dataset.name}", grid_coverage(cfg))
