"""Distortion of TurboQuant vs bit width against the paper's bounds (paper Fig. 3, Theorems 1-3).

For unit vectors x (the dataset's, normalised) and unit queries y, per method and bit width b:

    D_mse  = E‖x − x̃‖²                      (Theorem 1: 4^(-b) ≤ D_mse ≤ (√3·π/2)·4^(-b))
    D_prod = E(⟨y, x⟩ − ⟨y, x̃⟩)²            (Theorem 2: ‖y‖²/d·4^(-b) ≤ D_prod ≤ (√3·π²‖y‖²/d)·4^(-b))

the expectation over all base vectors (D_mse) and all query × vector pairs (D_prod), with ⟨y, x̃⟩ the
quantizer's inner-product estimate. Alongside, the predictions the paper's analysis makes for these
very quantizers: D_mse of TurboQuant_mse is its codebook's ``mse`` (Theorem 1's proof, Eq. 4), and
TurboQuant_prod's QJL stage on the residual r gives d·D_prod = (π/2 − 1/d)·E‖r‖² = (π/2 − 1/d)·D_mse(b−1)
for queries independent of x (Theorem 2's proof with Lemma 4; ``tq.bounds.prod_distortion``).

Each (method, b) is measured for every seed of ``experiment.quantizer_seeds`` (rotation and QJL
draws): one draw's D_prod varies by a few percent on real embeddings, so the comparison takes the mean over
draws with its standard error.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

import turboquant as tq
from experiments.coverage import frame_coverage
from experiments.io import ResultStore
from experiments.plotting import METHOD_COLORS, figure_style, figure_title, save_figure
from experiments.quantized_embeddings import (
    METHODS,
    UnitEmbeddings,
    load_unit_embeddings,
    make_quantizer,
    stream_inner_product_errors,
)

__all__ = ["RESULT_KEYS", "run", "plot", "over_seeds", "summary_table", "write_tables", "paper_comparison",
           "measure_distortion", "predicted_distortion"]

#: Config values that change the numbers but are not unit keys (method, bits and the quantizer seed are).
RESULT_KEYS = ("dataset", "seed", "scale.name", "experiment.sizes", "quantizer.rotation")


def predicted_distortion(method: str, dim: int, bits: int) -> dict[str, float]:
    """The paper's analysis applied to the exact Lloyd-Max codebooks used (NaN where it says nothing).

    TurboQuant_mse: D_mse = codebook(d, b).mse (Theorem 1). TurboQuant_prod: d·D_prod =
    (π/2 − 1/d)·D_mse(b−1) (Theorem 2 with Lemma 4; ``tq.bounds.prod_distortion``).
    """
    if method == "mse":
        return {"predicted_d_mse": tq.lloyd_max_codebook(dim, bits).mse, "predicted_d_prod_times_d": math.nan}
    if method == "prod":
        return {"predicted_d_mse": math.nan, "predicted_d_prod_times_d": dim * tq.bounds.prod_distortion(bits, dim)}
    raise ValueError(f"unknown method {method!r}; expected one of {sorted(METHODS)}")


def measure_distortion(quantizer: Any, data: UnitEmbeddings, pair_chunk: int) -> dict[str, float]:
    """Measured D_mse, D_prod, d·D_prod and the mean inner-product error (bias) of one quantizer."""
    quantized = quantizer.quantize(data.base)
    reconstruction = quantizer.dequantize(quantized).double()
    d_mse = float(((data.base.double() - reconstruction) ** 2).sum(dim=1).mean())

    sum_error = sum_squared = sum_true_squared = 0.0
    n_pairs = 0
    for block in stream_inner_product_errors(quantizer, quantized, data.base, data.queries, pair_chunk):
        error = block.error
        sum_error += float(error.sum())
        sum_squared += float(np.dot(error.ravel(), error.ravel()))
        sum_true_squared += float(np.dot(block.true.ravel(), block.true.ravel()))
        n_pairs += error.size
    d_prod = sum_squared / n_pairs
    return {
        "d_mse": d_mse,
        "d_prod": d_prod,
        "d_prod_times_d": d_prod * data.dim,
        "mean_ip_error": sum_error / n_pairs,
        "mean_squared_true_ip": sum_true_squared / n_pairs,
        "n_pairs": n_pairs,
    }


def run(cfg: Any, store: ResultStore) -> pd.DataFrame:
    """Measure every (method, bits) unit not yet in the store; return this run's rows."""
    exp = cfg.experiment
    units = [{"method": str(method), "bits": int(bits), "quantizer_seed": int(seed)}
             for seed in exp.quantizer_seeds for bits in exp.bits for method in exp.methods]

    def compute(unit: dict, data) -> list[dict]:
        quantizer = make_quantizer(unit["method"], data.dim, unit["bits"], cfg.quantizer.rotation,
                                   unit["quantizer_seed"])
        measured = measure_distortion(quantizer, data, int(exp.pair_chunk))
        return [{
            **measured,
            **predicted_distortion(unit["method"], data.dim, unit["bits"]),
            "dim": data.dim,
            "n_base": int(data.base.shape[0]),
            "n_queries": int(data.queries.shape[0]),
            "rotation": cfg.quantizer.rotation,
        }]

    frame = store.run_units(units, compute, prepare=lambda _: load_unit_embeddings(cfg, store),
                            progress=lambda data: f"distortion ({data.name}, d={data.dim})")
    if not frame.empty:
        write_tables(frame, cfg, store.directory)
    return frame


def _plus_minus(value: float, se: float = math.nan) -> str:
    return "" if pd.isna(value) else f"{value:.4g}" + ("" if pd.isna(se) else f" ± {se:.2g}")


def summary_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per method and b: D_mse and d·D_prod, mean ± SE over quantizer seeds, beside the paper's prediction for
    queries independent of x (``predicted_*``) and, for TurboQuant_prod at b = 1 (QJL on x itself), the prediction
    for these queries: one Gaussian QJL draw has d·Var = (π/2)‖x‖²‖y‖² − ⟨x,y⟩², so d·D_prod = π/2 − E⟨x,y⟩² for
    unit vectors (E⟨x,y⟩² = 1/d for independent ones, hence the paper's π/2 − 1/d)."""
    tables = []
    for method in [m for m in METHODS if m in set(df["method"])]:
        rows = df[df["method"] == method]
        table = over_seeds(rows, ["d_mse", "d_prod_times_d"])
        predicted = rows.groupby("bits")[["predicted_d_mse", "predicted_d_prod_times_d"]].first()
        table = table.join(predicted, on="bits")
        if "mean_squared_true_ip" in rows:
            these = math.pi / 2 - rows.groupby("bits")["mean_squared_true_ip"].mean()
            table["predicted_d_prod_times_d_these_queries"] = (
                table["bits"].map(these).where((table["bits"] == 1) & (method == "prod")))
        tables.append(table.assign(method=method))
    return pd.concat(tables, ignore_index=True)


def write_tables(df: pd.DataFrame, cfg: Any, directory: Path) -> list[Path]:
    """``summary_<dataset>.csv`` and ``.md``: :func:`summary_table` (``*_partial`` for a reduced run)."""
    table = summary_table(df)
    stem = frame_coverage(cfg, df).stem(f"summary_{cfg.dataset.name}")
    directory.mkdir(parents=True, exist_ok=True)
    csv_path, md_path = directory / f"{stem}.csv", directory / f"{stem}.md"
    table.to_csv(csv_path, index=False)
    title = df.attrs.get("provenance", {}).get("description", cfg.dataset.name)
    lines = [f"# Distortion vs bit width (paper Fig. 3, Theorems 1-2): {title}",
             "", "Mean ± SE over quantizer seeds (experiments/distortion.py); predictions: the paper's for queries "
             "independent of x, and for TurboQuant_prod at b = 1 the one for these queries (π/2 − E⟨x,y⟩²).", "",
             "| method | b | seeds | D_mse | predicted D_mse | d·D_prod | predicted d·D_prod | for these queries |",
             "|---|---|---|---|---|---|---|---|"]
    for row in table.itertuples():
        cells = [_plus_minus(row.d_mse, row.d_mse_se), _plus_minus(row.predicted_d_mse),
                 _plus_minus(row.d_prod_times_d, row.d_prod_times_d_se), _plus_minus(row.predicted_d_prod_times_d),
                 _plus_minus(getattr(row, "predicted_d_prod_times_d_these_queries", math.nan))]
        lines.append(f"| {METHODS[row.method]} | {int(row.bits)} | {int(row.seeds)} | " + " | ".join(cells) + " |")
    md_path.write_text("\n".join(lines) + "\n")
    return [csv_path, md_path]


def _bound_curves(bits: np.ndarray, dim: int) -> dict[str, np.ndarray]:
    return {
        "mse_upper": np.array([tq.bounds.mse_upper_bound(int(b)) for b in bits]),
        "mse_lower": np.array([tq.bounds.mse_lower_bound(int(b)) for b in bits]),
        "prod_upper": np.array([tq.bounds.prod_upper_bound(int(b), dim, y_norm=1.0) for b in bits]),
        "prod_lower": np.array([tq.bounds.prod_lower_bound(int(b), dim, y_norm=1.0) for b in bits]),
    }


def plot(df: pd.DataFrame, cfg: Any, figures_dir: str | Path) -> list[Path]:
    """Fig. 3: (a) inner-product error D_prod, (b) MSE D_mse, against bits, with the bounds, log y."""
    if df.empty:
        raise ValueError("no distortion rows to plot")
    provenance = df.attrs.get("provenance", {})
    dim = int(df["dim"].iloc[0])
    bits = np.sort(df["bits"].unique())
    bounds = _bound_curves(bits, dim)
    with figure_style():
        fig, (ax_prod, ax_mse) = plt.subplots(1, 2, figsize=(9.0, 4.4), constrained_layout=True)
        for method, label in METHODS.items():
            rows = over_seeds(df[df["method"] == method], ["d_prod", "d_mse"])
            if rows.empty:
                continue
            color, seeds = METHOD_COLORS[method], f"mean ± SE over {int(rows['seeds'].max())} quantizer seeds"
            ax_prod.errorbar(rows["bits"], rows["d_prod"], yerr=rows["d_prod_se"].fillna(0), fmt="o-", color=color,
                             capsize=3, label=f"{label} (measured, {seeds})")
            mse_label = f"{label} (measured)" if method == "mse" else f"{label} (measured; not an MSE quantizer)"
            ax_mse.errorbar(rows["bits"], rows["d_mse"], yerr=rows["d_mse_se"].fillna(0), color=color, capsize=3,
                            fmt="o-" if method == "mse" else "o:", label=mse_label)
        for ax, kind, theorem in ((ax_prod, "prod", "Thm. 2"), (ax_mse, "mse", "Thm. 1")):
            ax.plot(bits, bounds[f"{kind}_upper"], "--", color=METHOD_COLORS["bound"],
                    label=f"upper bound for {METHODS[kind]} ({theorem})")
            ax.plot(bits, bounds[f"{kind}_lower"], ":", color=METHOD_COLORS["bound"],
                    label="lower bound, any quantizer (Thm. 3)")
            ax.set_yscale("log")
            ax.set_xticks(bits)
            ax.set_xlabel("bit width b (bits per coordinate)")
            ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=1)
        ax_prod.set_ylabel("inner-product error $D_{prod}$\n" r"$E(\langle y,x\rangle-\langle y,\tilde x\rangle)^2$")
        ax_prod.set_title(f"(a) inner-product error, ‖y‖ = 1, d = {dim}")
        ax_mse.set_ylabel("mean squared error $D_{mse}$\n" r"$E\|x-\tilde x\|^2$")
        ax_mse.set_title("(b) mean squared error, ‖x‖ = 1")
        fig.suptitle(figure_title("TurboQuant distortion vs bit width (paper Fig. 3)", provenance))
        return save_figure(fig, figures_dir, f"fig3_distortion_{cfg.dataset.name}", frame_coverage(cfg, df))


def over_seeds(rows: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """Per bit width: the mean of ``columns`` over quantizer seeds, ``<column>_se`` (their standard error; NaN
    with one seed) and ``seeds``, sorted by bits (the first row's ``dim``, ``n_base``, ``n_queries`` kept)."""
    if rows.empty:
        return rows
    grouped = rows.groupby("bits")
    out = grouped[columns].mean()
    for column in columns:
        out[f"{column}_se"] = grouped[column].std(ddof=1) / np.sqrt(grouped[column].count())
    out["seeds"] = grouped[columns[0]].count()
    return out.join(grouped[["dim", "n_base", "n_queries"]].first()).reset_index().sort_values("bits")


def paper_comparison(df: pd.DataFrame) -> list[dict[str, Any]]:
    """D_mse of TurboQuant_mse and d·D_prod of TurboQuant_prod at b = 1..4 (Theorems 1-2 refined values), each
    the mean over quantizer seeds with its standard error."""
    out = []
    for method, column in (("mse", "d_mse"), ("prod", "d_prod_times_d")):
        table = over_seeds(df[df["method"] == method], [column])
        for row in table[table["bits"].between(1, 4)].itertuples():
            out.append(
                {
                    "id": f"distortion.{column}.b{int(row.bits)}",
                    "value": float(getattr(row, column)),
                    "se": float(getattr(row, f"{column}_se")),
                    "detail": (
                        f"{METHODS[method]}, d={int(row.dim)}, {int(row.n_base)} vectors"
                        + (f" x {int(row.n_queries)} queries" if method == "prod" else "")
                        + f", mean over {int(row.seeds)} quantizer seeds"
                    ),
                }
            )
    return out
