"""Uniform random unit vectors: the setting of the paper's theorems, for tests and for checking theory."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from experiments.data.source import SourceVectors


def load_random_sphere(cfg: Mapping[str, Any], n_total: int, seed: int) -> SourceVectors:
    """``n_total`` points uniform on S^(dim-1): normalised i.i.d. N(0, 1) vectors (rotation invariant)."""
    dim = int(cfg["dim"])
    if dim < 2:
        raise ValueError(f"random_sphere: dim must be >= 2, got {dim}")
    gaussian = np.random.default_rng(seed).standard_normal((n_total, dim))
    unit = gaussian / np.linalg.norm(gaussian, axis=1, keepdims=True)
    return SourceVectors(unit.astype(np.float32), {"generator": "numpy PCG64 normal, normalised", "seed": seed})
