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
3. **RaBitQ at equal stored bits** (RaBitQ authors, arXiv 2604.19528: recall RaBitQ > TurboQuant_mse >
   TurboQuant_prod). faiss's b-bit (extended) RaBitQ stores b bits plus per-vector factors: b + 0.42 bits per
   coordinate at d = 384 (``rabitq``, on the data turned by a seeded rotation of the unit's kind, RaBitQ's own
   random P). TurboQuant is given the same bits per vector (``mse_matched`` / ``prod_matched``) by the paper's
   fractional-bit recipe (§4.3: split the channels, run two independent instances): m coordinates at b + 1 bits
   and d − m at b, each part with its own rotation and norm, m the largest whose stored bytes fit RaBitQ's
   (:func:`split_for_budget`); the estimate of ⟨y, x⟩ is the sum of the parts'.

Per (method, rotation, b, quantizer seed), on unit base vectors x and unit queries y (all pairs):
D_mse = E‖x − x̃‖², d·D_prod = d·E(⟨y, x⟩ − est)², the mean error (bias), and recall@1@k: how often the
true top-1 inner-product neighbour of a query is among the k best estimates. The spread over seeds is the
quantizer's own randomness (Π, S); the data are fixed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch

from experiments.ann_recall import set_threads
from experiments.coverage import grid_coverage
from experiments.io import ResultStore, recorded_unit_ids
from experiments.plotting import METHOD_COLORS, figure_style, figure_title, save_figure
from experiments.quantized_embeddings import UnitEmbeddings, load_unit_embeddings, make_quantizer
from turboquant.ann import make_index
from turboquant.rotation import make_rotation

__all__ = ["METHODS", "MATCHED", "NEEDLE_ROTATION_PAIR", "RESULT_KEYS", "eden_scales", "stored_bits",
           "split_for_budget", "measure", "run", "seed_summary", "plot", "paper_comparison", "needle_rotation_comparison"]

RESULT_KEYS = ("dataset", "seed", "scale.name", "experiment.sizes", "experiment.recall_k")

#: Method names of the config and the rows, with their legend labels.
METHODS: dict[str, str] = {"mse": "TurboQuant_mse (scale 1)", "eden_unbiased": "EDEN, unbiased scale",
                           "eden_mse": "EDEN, least-squares scale", "prod": "TurboQuant_prod",
                           "rabitq": "RaBitQ (faiss, extended bits)",
                           "mse_matched": "TurboQuant_mse at RaBitQ's stored bits",
                           "prod_matched": "TurboQuant_prod at RaBitQ's stored bits"}
#: The TurboQuant methods stored at RaBitQ's bits per vector, and the quantizer each splits.
MATCHED: dict[str, str] = {"mse_matched": "mse", "prod_matched": "prod"}
_COLORS = {**METHOD_COLORS, "eden_unbiased": "#2ca02c", "eden_mse": "#ff7f0e", "rabitq": "#9467bd",
           "mse_matched": METHOD_COLORS["mse"], "prod_matched": METHOD_COLORS["prod"]}


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


def stored_bits(kind: str, dim: int, bits: int) -> int:
    """Bits one vector of ``dim`` coordinates costs in TurboQuant's :class:`~turboquant.QuantizedVectors`:
    the packed codes in whole bytes and a float32 norm; TurboQuant_prod stores (bits − 1)-bit codes, ⌈d/8⌉ bytes
    of QJL signs and the residual's float32 norm besides. :func:`measure` checks it against the codes' nbytes."""
    if kind == "mse":
        return 8 * math.ceil(dim * bits / 8) + 32
    if kind == "prod":
        return 8 * math.ceil(dim * (bits - 1) / 8) + 8 * math.ceil(dim / 8) + 64
    raise ValueError(f"unknown quantizer {kind!r}; expected mse or prod")


def split_for_budget(kind: str, dim: int, bits: int, budget: float) -> int:
    """The most coordinates m (0..dim) that can take ``bits + 1`` bits, the other dim − m ``bits``, as two
    independent TurboQuant instances (one when m is 0 or dim) within ``budget`` stored bits per vector."""
    def cost(m: int) -> int:
        return sum(stored_bits(kind, width, b) for width, b in ((m, bits + 1), (dim - m, bits)) if width)

    fitting = [m for m in range(dim + 1) if cost(m) <= budget]
    if not fitting:
        raise ValueError(f"{budget:g} bits per vector cannot hold {dim} coordinates of {bits}-bit TurboQuant_{kind} "
                         f"({cost(0)} bits)")
    return max(fitting)


def _split_quantize(kind: str, data: UnitEmbeddings, bits: int, high: int, rotation: str,
                    seed: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Reconstruction (n, d), inner-product estimates (m, n) and stored bytes of TurboQuant_``kind`` with the
    first ``high`` coordinates at ``bits + 1`` bits and the rest at ``bits``, each part its own instance."""
    x_hat = torch.zeros(data.base.shape, dtype=torch.float64)
    estimates = torch.zeros(data.queries.shape[0], data.base.shape[0], dtype=torch.float64)
    nbytes = 0
    parts = [(part, b) for part, b in ((slice(0, high), bits + 1), (slice(high, data.dim), bits))
             if part.stop > part.start]
    for i, (part, b) in enumerate(parts):
        width = part.stop - part.start
        quantizer = make_quantizer(kind, width, b, rotation, seed + 1_000_003 * i)  # independent instances
        codes = quantizer.quantize(data.base[:, part].contiguous())
        if codes.nbytes * 8 != stored_bits(kind, width, b) * len(codes):
            raise RuntimeError(f"TurboQuant_{kind} stored {codes.nbytes} bytes for {len(codes)} x {width} coordinates "
                               f"at {b} bits; stored_bits says {stored_bits(kind, width, b)} bits per vector")
        x_hat[:, part] = quantizer.dequantize(codes).double()
        estimates += quantizer.inner_product(data.queries[:, part].contiguous(), codes).double()
        nbytes += codes.nbytes
    return x_hat, estimates, nbytes


def _rabitq(data: UnitEmbeddings, bits: int, rotation: str, seed: int) -> tuple[torch.Tensor, float]:
    """faiss RaBitQ's inner-product estimates (m, n) of every pair, on base and queries turned by the seeded
    rotation (RaBitQ's random P; inner products unchanged), and its stored bits per coordinate."""
    turn = make_rotation(rotation, data.dim, seed)
    base, queries = turn.apply(data.base), turn.apply(data.queries)
    index = make_index("rabitq", data.dim, bits)
    index.train(base)
    index.add(base)
    scores, ids = index.search(queries, index.ntotal)
    estimates = torch.empty(queries.shape[0], index.ntotal, dtype=torch.float64)
    estimates.scatter_(1, ids, scores.double())
    return estimates, index.bits_per_coordinate


def _error_row(method: str, estimates: torch.Tensor, true: torch.Tensor, truth: torch.Tensor, data: UnitEmbeddings,
               bits_per_coordinate: float, recall_k: list[int]) -> dict[str, Any]:
    error = estimates - true
    return {"method": method, "d_prod_times_d": float((error**2).mean()) * data.dim,
            "mean_ip_error": float(error.mean()), "bits_per_coordinate": bits_per_coordinate,
            **{f"recall_at_{k}": _recall_at(estimates, truth, k) for k in recall_k},
            "dim": data.dim, "n_base": int(data.base.shape[0]), "n_queries": int(data.queries.shape[0])}


def measure(rotation: str, bits: int, seed: int, data: UnitEmbeddings, methods: list[str],
            recall_k: list[int]) -> list[dict[str, Any]]:
    """One row per method of one quantizer draw: D_mse, d·D_prod, bias, stored bits per coordinate and
    recall@1@k. TurboQuant_mse and both EDEN scales share one set of codes (EDEN only rescales); the matched
    methods are stored in RaBitQ's bits per vector (``high_bit_coordinates`` of them at ``bits + 1``)."""
    queries, base = data.queries.double(), data.base.double()
    true = queries @ base.T
    truth = true.argmax(dim=1)
    rows = []
    for kind, members in (("mse", ("mse", "eden_unbiased", "eden_mse")), ("prod", ("prod",))):
        members = [m for m in members if m in methods]
        if not members:
            continue
        quantizer = make_quantizer(kind, data.dim, bits, rotation, seed)
        codes = quantizer.quantize(data.base)
        x_hat = quantizer.dequantize(codes).double()
        estimates = quantizer.inner_product(data.queries, codes).double()
        for method in members:
            factor = eden_scales(base, x_hat, method) if method.startswith("eden") else torch.ones(len(base), dtype=torch.float64)
            # EDEN's scale takes the norm's place: the same stored bits
            rows.append({**_error_row(method, estimates * factor[None, :], true, truth, data,
                                      codes.bits_per_coordinate, recall_k),
                         "d_mse": float(((base - x_hat * factor[:, None]) ** 2).sum(dim=1).mean())})
    if "rabitq" in methods or set(MATCHED) & set(methods):
        estimates, rabitq_bits = _rabitq(data, bits, rotation, seed)
        if "rabitq" in methods:
            rows.append(_error_row("rabitq", estimates, true, truth, data, rabitq_bits, recall_k))
        for method in (m for m in MATCHED if m in methods):
            kind = MATCHED[method]
            high = split_for_budget(kind, data.dim, bits, rabitq_bits * data.dim)
            x_hat, estimates, nbytes = _split_quantize(kind, data, bits, high, rotation, seed)
            rows.append({**_error_row(method, estimates, true, truth, data, nbytes * 8 / base.numel(), recall_k),
                         "d_mse": float(((base - x_hat) ** 2).sum(dim=1).mean()), "high_bit_coordinates": high})
    return rows


def run(cfg: Any, store: ResultStore) -> pd.DataFrame:
    """Every (rotation, bits, quantizer seed) unit not yet in the store (one row per method); this run's rows."""
    exp = cfg.experiment
    methods = [str(m) for m in exp.methods]
    unknown = set(methods) - set(METHODS)
    if unknown:
        raise ValueError(f"unknown methods {sorted(unknown)}; expected some of {sorted(METHODS)}")
    equal_bits = {"rabitq", *MATCHED}
    rabitq_rotations = [str(r) for r in exp.rabitq_rotations]
    if not set(rabitq_rotations) <= {str(r) for r in exp.rotations}:
        raise ValueError(f"rabitq_rotations {rabitq_rotations} must be among the rotations {list(exp.rotations)}")

    def measured(rotation: str) -> list[str]:
        return [m for m in methods if rotation in rabitq_rotations or m not in equal_bits]

    units = [{"rotation": str(r), "bits": int(b), "quantizer_seed": int(s), "methods": ",".join(measured(str(r)))}
             for r in exp.rotations for b in exp.bits for s in exp.seeds]

    def prepare(missing: list) -> Any:
        set_threads(int(exp.threads))
        data = load_unit_embeddings(cfg)
        store.record_provenance(**data.provenance())
        return data

    def compute(unit: Mapping[str, Any], data: Any) -> list[dict[str, Any]]:
        return measure(unit["rotation"], unit["bits"], unit["quantizer_seed"], data, unit["methods"].split(","),
                       [int(k) for k in exp.recall_k])

    return store.run_units(units, compute, prepare=prepare,
                           progress=lambda data: f"quantizer disputes ({data.name}, d={data.dim})")


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


def _mean(df: pd.DataFrame, column: str, keys: dict[str, Any]) -> float:
    rows = df[np.logical_and.reduce([df[k] == v for k, v in keys.items()])]
    return float(rows[column].mean()) if len(rows) else math.nan


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
        for key, (num, den) in (("rabitq_vs_mse_equal_bits", ("rabitq", "mse_matched")),
                                ("mse_vs_prod_equal_bits", ("mse_matched", "prod_matched"))):
            add(f"{key}.recall_at_1.b{b}", _paired(df, "recall_at_1", {**haar, "method": num}, {**haar, "method": den},
                                                   ratio=False),
                f"recall@1@1 of {METHODS[num]} − {METHODS[den]}, {b}-bit RaBitQ's stored bits "
                f"({_mean(df, 'bits_per_coordinate', {**haar, 'method': 'rabitq'}):.3g} per coordinate), Haar")
    add("eden_2bit_vs_prod_3bit", _paired(df, "d_prod_times_d", {"method": "eden_unbiased", "rotation": "haar", "bits": 2},
                                                {"method": "prod", "rotation": "haar", "bits": 3}),
        "d·D_prod 2-bit EDEN (unbiased scale) / 3-bit TurboQuant_prod, Haar")
    return out


#: The rotation dispute on needle scores (paper_numbers.yaml: experiments.needle.comparisons): the method key
#: of the paper's TurboQuant preset with the randomized Hadamard rotation, and the same preset with Haar.
NEEDLE_ROTATION_PAIR = ("turboquant_3p5_window_hadamard", "turboquant_3p5_window")


def needle_rotation_comparison(df: pd.DataFrame) -> list[dict[str, Any]]:
    """``disputes.hadamard_vs_haar.needle`` from a needle run's rows: per (context, depth) cell, the score of
    the Hadamard preset minus the Haar preset's (each averaged over its seeds), mean over the cells both have; only
    the latest run's cells count (``unit_ids`` in the provenance), as in needle's own rows. The SE is the larger of
    the SE over cells and, when both methods have two seeds or more, the SE over seeds (the difference of the two
    methods' seed means on those cells): one rotation serves every cell of a seed, so the cells are not independent
    draws of the rotation."""
    unit_ids = recorded_unit_ids(df.attrs.get("provenance", {}))
    if unit_ids is not None:
        df = df[df["unit_id"].isin(set(unit_ids))]
    if df.empty or not set(NEEDLE_ROTATION_PAIR) <= set(df["method"]):
        return []
    hadamard, haar = (df[df["method"] == m].groupby(["context", "depth"])["score"].mean() for m in NEEDLE_ROTATION_PAIR)
    diff = (hadamard - haar).dropna()
    if diff.empty:
        return []
    seeds = {m: int(df.loc[df["method"] == m, "method_seed"].nunique()) for m in NEEDLE_ROTATION_PAIR}
    se = float(diff.std(ddof=1) / math.sqrt(len(diff))) if len(diff) > 1 else math.nan
    if min(seeds.values()) > 1:
        cells = df.set_index(["context", "depth"]).index.isin(diff.index)
        seed_means = [df[cells & (df["method"] == m)].groupby("method_seed")["score"].mean()
                      for m in NEEDLE_ROTATION_PAIR]
        se = max(se, math.sqrt(sum(float(means.var(ddof=1)) / len(means) for means in seed_means)))
    return [{"id": "disputes.hadamard_vs_haar.needle", "value": float(diff.mean()), "se": se,
             "detail": f"{NEEDLE_ROTATION_PAIR[0]} ({seeds[NEEDLE_ROTATION_PAIR[0]]} seeds) − {NEEDLE_ROTATION_PAIR[1]} "
                       f"({seeds[NEEDLE_ROTATION_PAIR[1]]} seeds), mean of {len(diff)} per-cell differences "
                       f"(contexts {sorted(int(c) for c in diff.index.get_level_values('context').unique())}), "
                       f"model {df['model_label'].iloc[0]}"}]


#: The methods of the scale dispute (panels a-b), and of the equal-stored-bits panel (d) in its legend order.
_SCALE_METHODS = ("mse", "eden_unbiased", "eden_mse", "prod")
_BITS_METHODS = ("rabitq", "mse_matched", "prod_matched", "mse", "prod")


def plot(df: pd.DataFrame, cfg: Any, figures_dir: str | Path) -> list[Path]:
    """(a) d·D_prod and (b) D_mse against b per method (Haar), (c) Hadamard / Haar of each, (d) recall@1@1
    against the stored bits per coordinate (RaBitQ and TurboQuant at its bits); ± SE over seeds."""
    if df.empty:
        raise ValueError("no quantizer-dispute rows to plot")
    provenance = df.attrs.get("provenance", {})
    seeds = int(df.groupby(["method", "rotation", "bits"]).size().min())  # one row per method and draw
    bits = sorted(df["bits"].unique())
    haar = df[df["rotation"] == "haar"]
    with figure_style():
        fig, axes = plt.subplots(2, 2, figsize=(11, 7.6), constrained_layout=True)
        axes = axes.flat
        for ax, column, label in ((axes[0], "d_prod_times_d", r"$d\cdot D_{prod}$"), (axes[1], "d_mse", r"$D_{mse}$")):
            summary = seed_summary(haar[haar["method"].isin(_SCALE_METHODS)], column)
            for method, part in summary.groupby("method", sort=False):
                ax.errorbar(part["bits"], part["mean"], yerr=part["se"], marker="o", capsize=3,
                            color=_COLORS.get(method), label=METHODS.get(method, method))
            ax.set_yscale("log")
            ax.set_xlabel("bits per coordinate b")
            ax.set_ylabel(label)
            ax.set_xticks(bits)
        axes[0].set_title("(a) inner-product error, Haar rotation")
        axes[1].set_title("(b) mean squared error, Haar rotation")
        axes[0].legend()
        ax = axes[2]
        for method, column, marker in (("mse", "d_mse", "o"), ("prod", "d_prod_times_d", "s")):
            stats = [_paired(df, column, {"method": method, "rotation": "hadamard", "bits": b},
                                   {"method": method, "rotation": "haar", "bits": b}) for b in bits]
            ax.errorbar(bits, [s[0] for s in stats], yerr=[s[1] for s in stats], marker=marker, capsize=3,
                        color=_COLORS[method], label=f"{METHODS[method]}: {column}")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(bits)
        ax.set_xlabel("bits per coordinate b")
        ax.set_ylabel("randomized Hadamard / Haar")
        ax.set_title("(c) rotation: Hadamard vs the paper's Haar")
        ax.legend()
        ax = axes[3]
        for method in (m for m in _BITS_METHODS if m in set(haar["method"])):
            rows = haar[haar["method"] == method]
            recall, stored = seed_summary(rows, "recall_at_1"), seed_summary(rows, "bits_per_coordinate")
            ax.errorbar(stored["mean"], recall["mean"], yerr=recall["se"], capsize=3, color=_COLORS.get(method),
                        marker="o" if method in MATCHED or method == "rabitq" else "x",
                        linestyle="-" if method in MATCHED or method == "rabitq" else ":", label=METHODS[method])
        ax.set_xlabel("stored bits per coordinate (codes, norms and factors)")
        ax.set_ylabel("recall@1@1")
        ax.set_title("(d) RaBitQ vs TurboQuant at equal stored bits, Haar")
        ax.legend()
        fig.suptitle(figure_title(f"Disputes at equal stored bits: EDEN's scale, the rotation, RaBitQ (mean ± SE over "
                                  f"{seeds} quantizer seeds)", provenance))
        return save_figure(fig, figures_dir, f"disputes_quantizers_{cfg.dataset.name}", grid_coverage(cfg))
