"""Shared plumbing of the distortion experiments (paper Figs. 1-3): unit-norm embeddings, the two
TurboQuant quantizers by name, and the query × vector inner-product errors streamed in chunks.

The paper measures on unit vectors x (dataset vectors) and queries y with ‖y‖ = 1, over ALL
query × vector pairs. With m queries and n vectors that is m·n estimates; they are produced
``pair_chunk`` at a time (a block of vectors against every query), so memory is O(pair_chunk), never
O(m·n·d) nor O(m·n).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

import turboquant as tq
from experiments.data.embeddings import dataset_provenance, load_embeddings
from experiments.io import experiment_sizes

__all__ = [
    "METHODS",
    "UnitEmbeddings",
    "load_dataset",
    "load_unit_embeddings",
    "make_quantizer",
    "PairBlock",
    "stream_inner_product_errors",
    "pair_blocks",
]

#: Method names used in configs, CSV rows and figure legends.
METHODS: dict[str, str] = {"mse": "TurboQuant_mse", "prod": "TurboQuant_prod"}


@dataclass(frozen=True)
class UnitEmbeddings:
    """Unit-normalised base vectors and queries, plus what the data actually is."""

    base: torch.Tensor  # (n, d) float32, rows of norm 1
    queries: torch.Tensor  # (m, d) float32, rows of norm 1
    name: str
    description: str
    substitution: str | None
    source: dict[str, Any]

    @property
    def dim(self) -> int:
        return int(self.base.shape[1])

    def provenance(self) -> dict[str, Any]:
        return dataset_provenance(self)


def load_dataset(dataset_cfg: Any, n_base: int, n_queries: int, seed: int) -> Any:
    """``n_base`` vectors and ``n_queries`` held-out queries of the configured set (experiments/data/)."""
    return load_embeddings(dataset_cfg, n_base=n_base, n_queries=n_queries, seed=seed)


def _unit_rows(vectors: np.ndarray, what: str) -> torch.Tensor:
    array = np.asarray(vectors, dtype=np.float32)
    if array.ndim != 2 or array.shape[0] == 0:
        raise ValueError(f"{what} must be a non-empty (n, d) array, got shape {array.shape}")
    if not np.isfinite(array).all():
        raise ValueError(f"{what} contain non-finite values")
    norms = np.linalg.norm(array.astype(np.float64), axis=1)
    if (norms == 0).any():
        raise ValueError(f"{what} contain {int((norms == 0).sum())} all-zero rows: they have no direction")
    return torch.from_numpy((array / norms[:, None]).astype(np.float32))


def load_unit_embeddings(cfg: Any, store: Any = None) -> UnitEmbeddings:
    """The configured dataset at this scale's ``n_base`` / ``n_queries``, every row normalised to ‖·‖ = 1; with a
    ``store`` (:class:`experiments.io.ResultStore`), its provenance is recorded there."""
    sizes = experiment_sizes(cfg)
    n_base, n_queries = int(sizes.n_base), int(sizes.n_queries)
    if n_base < 1 or n_queries < 1:
        raise ValueError(f"sizes must be positive, got n_base={n_base}, n_queries={n_queries}")
    data = load_dataset(cfg.dataset, n_base, n_queries, int(cfg.seed))
    if data.base.shape[0] != n_base or data.queries.shape[0] != n_queries:
        raise ValueError(
            f"dataset {data.name!r} returned {data.base.shape[0]} base vectors and {data.queries.shape[0]} "
            f"queries; scale {cfg.scale.name!r} asked for {n_base} and {n_queries}"
        )
    embeddings = UnitEmbeddings(
        base=_unit_rows(data.base, f"{data.name} base vectors"),
        queries=_unit_rows(data.queries, f"{data.name} queries"),
        name=data.name,
        description=data.description,
        substitution=data.substitution,
        source=dict(getattr(data, "source", {}) or {}),
    )
    if store is not None:
        store.record_provenance(**embeddings.provenance())
    return embeddings


def make_quantizer(method: str, dim: int, bits: int, rotation: str, seed: int) -> Any:
    """TurboQuant_mse (Algorithm 1) or TurboQuant_prod (Algorithm 2) by config name."""
    if method == "mse":
        return tq.TurboQuantMSE(dim, bits, rotation=rotation, seed=seed)
    if method == "prod":
        return tq.TurboQuantProd(dim, bits, rotation=rotation, seed=seed)
    raise ValueError(f"unknown method {method!r}; expected one of {sorted(METHODS)}")


@dataclass(frozen=True)
class PairBlock:
    """Exact and estimated inner products of every query with one block of vectors, (m, c) float64."""

    true: np.ndarray
    estimate: np.ndarray

    @property
    def error(self) -> np.ndarray:
        """⟨y, x̃⟩ − ⟨y, x⟩ (the paper's Fig. 1 x-axis)."""
        return self.estimate - self.true


def stream_inner_product_errors(
    quantizer: Any, quantized: Any, base: torch.Tensor, queries: torch.Tensor, pair_chunk: int
) -> Iterator[PairBlock]:
    """Yield :class:`PairBlock` s covering all ``len(queries) × len(base)`` pairs, ``pair_chunk`` at a time.

    The exact ⟨y, x⟩ is computed in float64; the estimate is the quantizer's ``inner_product`` on the
    stored codes (for TurboQuant_mse ⟨y, x̃⟩; for TurboQuant_prod the unbiased estimator of Algorithm 2).
    """
    if pair_chunk < 1:
        raise ValueError(f"pair_chunk must be positive, got {pair_chunk}")
    n, m = base.shape[0], queries.shape[0]
    block = max(1, pair_chunk // m)
    queries64 = queries.double()
    for start in range(0, n, block):
        stop = min(n, start + block)
        true = (queries64 @ base[start:stop].double().T).numpy()
        estimate = quantizer.inner_product(queries, quantized[start:stop]).double().numpy()
        yield PairBlock(true=true, estimate=estimate)


def pair_blocks(n_base: int, n_queries: int, pair_chunk: int) -> int:
    """Number of blocks :func:`stream_inner_product_errors` yields (for progress bars)."""
    block = max(1, pair_chunk // n_queries)
    return -(-n_base // block)
