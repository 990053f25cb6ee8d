"""A fixed Haar-random isometry that lifts embeddings into a higher dimension.

The paper's DBpedia sets are 1536- and 3072-d OpenAI embeddings; no model that makes them ships here.
``lift`` maps real d-dimensional vectors into D > d dimensions by ``x ↦ M x`` with ``M`` a D × d
matrix with orthonormal columns (``MᵀM = I_d``), drawn once from the Haar measure on the Stiefel
manifold by a seeded QR decomposition. Then ``⟨Mx, My⟩ = xᵀMᵀMy = ⟨x, y⟩`` for every pair, so norms,
inner products and nearest neighbours are preserved exactly (up to float32 rounding).

What that buys: TurboQuant first applies a Haar rotation Π, and ``Π M x`` is distributed as a uniform
point of the D-sphere scaled by ``‖x‖``, so its per-coordinate behaviour (Lemma 1, Theorems 1-2) is that
of any unit vector in dimension D. What it does not: the lifted data still lie in a d-dimensional
subspace of R^D, so data-dependent methods (PQ codebooks, RaBitQ's centroid) see that low-rank
structure, not the spectrum of real D-dimensional embeddings.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np


@lru_cache(maxsize=4)
def haar_isometry(dim_in: int, dim_out: int, seed: int) -> np.ndarray:
    """Return a (dim_out, dim_in) float64 matrix with orthonormal columns, Haar-distributed (read-only).

    QR of a Gaussian (dim_out, dim_in) matrix, with the columns' signs fixed by sign(diag R) so the
    distribution is exactly Haar (plain QR is biased by LAPACK's sign convention). Deterministic in
    ``seed``; cached, since every load of a lifted dataset needs the same matrix.
    """
    if not 0 < dim_in <= dim_out:
        raise ValueError(f"an isometry needs 0 < dim_in <= dim_out, got dim_in={dim_in}, dim_out={dim_out}")
    gaussian = np.random.default_rng(seed).standard_normal((dim_out, dim_in))
    q, r = np.linalg.qr(gaussian)
    signs = np.sign(np.diag(r))
    signs[signs == 0] = 1.0
    isometry = q * signs
    isometry.flags.writeable = False
    return isometry


def lift(x: np.ndarray, dim_out: int, seed: int) -> np.ndarray:
    """Map rows of ``x`` (n, d) to (n, dim_out) float32 by the fixed isometry ``haar_isometry(d, dim_out, seed)``.

    Computed in float32 (inner products are preserved to float32 rounding, ~1e-7 relative), so lifting
    100k vectors to 3072-d needs no float64 copy.
    """
    if x.ndim != 2:
        raise ValueError(f"lift expects a (n, d) matrix, got shape {x.shape}")
    isometry = haar_isometry(x.shape[1], dim_out, seed).astype(np.float32)
    return np.asarray(x, dtype=np.float32) @ isometry.T
