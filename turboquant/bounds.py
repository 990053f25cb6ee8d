"""The paper's distortion bounds (unit-norm x; D_prod scales with ‖y‖²).

* Theorem 1 (upper, TurboQuant_mse):   D_mse  ≤ √3·π/2 · 4^(−b)            ≈ 2.72 · 4^(−b)
* Theorem 2 (upper, TurboQuant_prod):  D_prod ≤ √3·π² · ‖y‖²/d · 4^(−b)
* Theorem 3 (lower, any quantizer):    D_mse  ≥ 4^(−b),   D_prod ≥ ‖y‖²/d · 4^(−b)

The constant is √3·π/2 ≈ 2.7207, not √(3π)/2 ≈ 1.535. The paper also quotes refined values for small b
(D_mse ≈ 0.36, 0.117, 0.03, 0.009 and d·D_prod ≈ 1.57, 0.56, 0.18, 0.047 for b = 1..4); the exact
Lloyd-Max values come from :func:`turboquant.codebook.lloyd_max_codebook` (``.mse``) and
:func:`prod_distortion`.
"""

from __future__ import annotations

import math

from ._validation import check_int, check_real
from .codebook import lloyd_max_codebook

__all__ = ["mse_upper_bound", "mse_lower_bound", "prod_upper_bound", "prod_lower_bound", "prod_distortion"]

MSE_UPPER_CONSTANT = math.sqrt(3.0) * math.pi / 2.0
PROD_UPPER_CONSTANT = math.sqrt(3.0) * math.pi ** 2


def _check(bits: int) -> int:
    return check_int(bits, "bits", low=0)


def _check_prod(bits: int, dim: int, y_norm: float) -> tuple[int, int, float]:
    return _check(bits), check_int(dim, "dim", low=2), check_real(y_norm, "y_norm", low=0.0)


def mse_upper_bound(bits: int) -> float:
    """Theorem 1: √3·π/2 · 4^(−b)."""
    return MSE_UPPER_CONSTANT * 4.0 ** (-_check(bits))


def mse_lower_bound(bits: int) -> float:
    """Theorem 3: 4^(−b), for any (randomised) b-bit quantizer of the unit sphere."""
    return 4.0 ** (-_check(bits))


def prod_upper_bound(bits: int, dim: int, y_norm: float = 1.0) -> float:
    """Theorem 2: √3·π² · ‖y‖²/d · 4^(−b)."""
    bits, dim, y_norm = _check_prod(bits, dim, y_norm)
    return PROD_UPPER_CONSTANT * y_norm ** 2 / dim * 4.0 ** (-bits)


def prod_lower_bound(bits: int, dim: int, y_norm: float = 1.0) -> float:
    """Theorem 3: ‖y‖²/d · 4^(−b)."""
    bits, dim, y_norm = _check_prod(bits, dim, y_norm)
    return y_norm ** 2 / dim * 4.0 ** (-bits)


def prod_distortion(bits: int, dim: int, y_norm: float = 1.0, density: str = "exact") -> float:
    """The exact D_prod of TurboQuant_prod (Haar Π) when y's direction is uniform and independent of x.

    Given the residual r of the (b−1)-bit MSE stage, the QJL term √(π/2)/d · ‖r‖ · ⟨Sy, sign(Sr)⟩ is a
    sum of d i.i.d. terms of mean ⟨y, r⟩/d; its variance is (π/2 · ‖y‖²‖r‖² − ⟨y, r⟩²)/d. For an
    isotropic y, E⟨y, r⟩² = ‖y‖²‖r‖²/d, and E‖r‖² = D_mse(b−1) (= 1 at b = 1), so

        D_prod = (π/2 − 1/d) · ‖y‖² · D_mse(b−1) / d.

    For large d this is the paper's d·D_prod ≈ π/2 · D_mse(b−1): 1.571, 0.571, 0.185, 0.054 at b = 1..4.
    """
    bits, dim, y_norm = _check_prod(bits, dim, y_norm)
    if bits < 1:
        raise ValueError("TurboQuant_prod needs bits ≥ 1")
    residual = 1.0 if bits == 1 else lloyd_max_codebook(dim, bits - 1, density).mse
    return (math.pi / 2.0 - 1.0 / dim) * y_norm ** 2 * residual / dim
