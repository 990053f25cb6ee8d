"""What every embedding loader returns, and the row sampling and checks they share."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class SourceVectors:
    """``vectors`` (n, d) float32, rows in random order, and where they came from (``source``)."""

    vectors: np.ndarray
    source: dict[str, Any] = field(default_factory=dict)


def sample_rows(pool_size: int, n_total: int, seed: int, what: str) -> np.ndarray:
    """``n_total`` distinct row indices of a pool of ``pool_size`` rows, in a seeded random order.

    Distinct indices are what makes the held-out queries disjoint from the base set.
    """
    if n_total < 1:
        raise ValueError(f"{what}: asked for {n_total} vectors; need at least 1")
    if n_total > pool_size:
        raise ValueError(f"{what}: asked for {n_total} vectors (base + queries) but only {pool_size} are available")
    return np.random.default_rng(seed).permutation(pool_size)[:n_total]


def check_vectors(vectors: np.ndarray, expected_dim: int | None, what: str) -> np.ndarray:
    """Return ``vectors`` as float32 (n, d) after checking the shape, the dimension and finiteness."""
    if vectors.ndim != 2:
        raise ValueError(f"{what}: expected a (n, d) matrix of embeddings, got shape {vectors.shape}")
    if expected_dim is not None and vectors.shape[1] != expected_dim:
        raise ValueError(
            f"{what}: vectors have dimension {vectors.shape[1]} but the dataset config says dim={expected_dim}"
        )
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    bad_rows = np.flatnonzero(~np.isfinite(vectors).all(axis=1))
    if bad_rows.size:
        raise ValueError(
            f"{what}: {bad_rows.size} vector(s) contain NaN or inf (first at sampled row {bad_rows[0]})"
        )
    return vectors
