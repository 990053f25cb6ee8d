"""The checks every public entry point of turboquant applies to its arguments, in one place.

Nothing in the package is imported here, so every module (quantizers, codebook, rotation, packing,
bounds, the kernels and the KV cache layers) can use these checks without an import cycle.

Conventions, the same everywhere:

* every refusal is a ``ValueError`` whose message names the argument, what was expected and what was
  given;
* integer options (``dim``, ``bits``, ``seed``, ...) accept Python and NumPy integers and refuse
  ``bool`` (``bits=True`` is not 1), floats (``seed=2.7`` is not 2), strings and ``None``;
* vector inputs are floating-point tensors (float16, bfloat16, float32 or float64); integer, bool and
  complex tensors are refused by name rather than cast (a cast would truncate or drop the imaginary part).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from numbers import Integral, Real
from typing import Any

import torch

__all__ = [
    "FLOAT_DTYPES", "SAFE_NORMS", "all_finite", "check_choice", "check_device", "check_finite", "check_int",
    "check_real", "check_vectors", "unit_vectors",
]

#: The dtypes a vector input may have.
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _describe(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


def check_int(value: Any, name: str, low: int | None = None, high: int | None = None) -> int:
    """``value`` as a Python int, if it is an integer (Python or NumPy, not bool) in [low, high]."""
    span = (f" in [{low}, {high}]" if low is not None and high is not None else
            f" ≥ {low}" if low is not None else f" ≤ {high}" if high is not None else "")
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise ValueError(f"{name} must be an integer{span}, got {_describe(value)}")
    value = int(value)
    if (low is not None and value < low) or (high is not None and value > high):
        raise ValueError(f"{name} must be an integer{span}, got {value}")
    return value


def check_real(value: Any, name: str, low: float | None = None) -> float:
    """``value`` as a finite Python float (Python or NumPy real, not bool), at least ``low`` if given."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ValueError(f"{name} must be a real number, got {_describe(value)}")
    value = float(value)
    if not math.isfinite(value) or (low is not None and value < low):
        bound = f" ≥ {low}" if low is not None else ""
        raise ValueError(f"{name} must be a finite number{bound}, got {value}")
    return value


def check_choice(value: Any, name: str, choices: Sequence[str]) -> str:
    """``value`` if it is one of the strings ``choices``."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}")
    return value


def check_device(device: Any, name: str = "device") -> torch.device:
    """``device`` (a torch.device, a string such as ``"cuda:0"``, or None for the CPU) as a torch.device."""
    if device is None:
        return torch.device("cpu")
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"{name} must be a torch.device or a device string such as 'cpu' or 'cuda:0', "
                         f"got {_describe(device)}") from error


def check_vectors(x: Any, name: str, dim: int | None = None) -> torch.Tensor:
    """``x`` if it is a floating-point tensor of at least one dimension (last dimension ``dim`` if given)."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in FLOAT_DTYPES:
        kind = ("a complex" if x.dtype.is_complex else "a bool" if x.dtype == torch.bool else
                "an integer" if not x.dtype.is_floating_point else "an unsupported floating-point")
        raise ValueError(f"{name} must be float16, bfloat16, float32 or float64, got {kind} tensor ({x.dtype}); "
                         "convert it explicitly (e.g. x.float())")
    if x.ndim == 0 or (dim is not None and x.shape[-1] != dim):
        expected = f"last dimension {dim}" if dim is not None else "at least one dimension"
        raise ValueError(f"{name} must have {expected}, got shape {tuple(x.shape)}")
    return x


def all_finite(x: torch.Tensor) -> bool:
    """Whether x holds no NaN or ±Inf. Min and max are NaN if any entry is (±inf if one is), so one
    multi-threaded aminmax pass and no (…, d) bool temporary (100k x 1536 on 2 CPU cores: isfinite().all()
    0.33 s, NumPy min + max 0.09 s, aminmax 0.04 s)."""
    return not x.numel() or all(bool(torch.isfinite(extreme)) for extreme in torch.aminmax(x))


def check_finite(x: torch.Tensor, name: str) -> torch.Tensor:
    """``x`` if it holds no NaN or ±Inf."""
    if not all_finite(x):
        raise ValueError(f"{name} contains NaN or Inf")
    return x


#: Norms in this open interval come out right from the plain sum of squares in float32 (for d ≤ 10⁶ no square
#: under- or overflows); vectors outside it (zero, tiny, huge or non-finite) need the rescaled computation.
SAFE_NORMS = (1e-15, 1e15)


def unit_vectors(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x / ||x||, ||x||)`` over the last dimension, in x's dtype; a zero vector stays zero.

    When some ||x|| lies outside :data:`SAFE_NORMS`, every vector is first divided by its largest |x_j| (the
    quotient has entries in [-1, 1] and one of ±1), so its squares can neither underflow nor overflow: every
    finite nonzero x keeps its direction whatever its magnitude (entries of 1e-30 or 1e30 in float32
    included), with ||x|| = max_j |x_j| · ||x / max_j |x_j|||. Otherwise the plain quotient is exact and cheaper.
    """
    norms = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    if bool(((norms > SAFE_NORMS[0]) & (norms < SAFE_NORMS[1])).all()):
        return x / norms, norms.squeeze(-1)
    peak = torch.linalg.vector_norm(x, ord=math.inf, dim=-1, keepdim=True)
    scaled = x / torch.where(peak > 0, peak, torch.ones_like(peak))
    scaled_norms = torch.linalg.vector_norm(scaled, dim=-1, keepdim=True)
    unit = scaled / torch.where(scaled_norms > 0, scaled_norms, torch.ones_like(scaled_norms))
    return unit, (scaled_norms * peak).squeeze(-1)
