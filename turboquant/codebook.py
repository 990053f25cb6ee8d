"""Lloyd-Max scalar codebooks for the coordinates of a random rotation of a unit vector.

After a Haar rotation Π, each coordinate X of Πx (x on the unit sphere S^(d-1)) has the density
(paper, Lemma 1)

    f_d(x) = Γ(d/2) / (√π Γ((d-1)/2)) · (1 - x²)^((d-3)/2),   x ∈ [-1, 1],

i.e. X = 2B - 1 with B ~ Beta(a, a), a = (d-1)/2.  TurboQuant_mse quantizes every coordinate with the
optimal 2^b-level scalar quantizer for f_d (paper, Eq. 4): the Lloyd-Max fixed point

    c_i = E[X | t_(i-1) < X ≤ t_i],     t_i = (c_i + c_(i+1)) / 2.

Everything here is computed from closed forms, never from a sampled grid: the probability, first and
second moments of X over an interval are regularised incomplete beta functions,

    P(X ≤ t)      = I_u(a, a)                                 with u = (1 + t) / 2,
    E[B; B ≤ u]   = ½ · I_u(a + 1, a),
    E[B²; B ≤ u]  = a (a + 1) / (2a (2a + 1)) · I_u(a + 2, a),

which scipy evaluates accurately for every d ≥ 2 (a up to ~10⁴ and beyond). The Gaussian limit
N(0, 1/d) (``density="gaussian"``) uses the normal CDF/PDF in the same way.

The reported ``mse`` is ``d · E[(X - c(X))²]``: the D_mse = E‖x - x̃‖² of a unit vector, which the paper
bounds by √3·π/2 · 4^(-b) (Theorem 1) and reports as ≈ 0.36, 0.117, 0.03, 0.009 for b = 1..4.
"""

from __future__ import annotations

import functools
import hashlib
import os
import warnings
import weakref
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from scipy import linalg, special, stats

from ._validation import check_choice, check_int

__all__ = ["Codebook", "lloyd_max_codebook", "symmetric_codebook", "SUPPORTED_DENSITIES", "MAX_BITS"]

SUPPORTED_DENSITIES = ("exact", "gaussian")
MAX_BITS = 8
_CACHE_VERSION = 1
_MAX_ITERATIONS = 2_000
_TOLERANCE = 1e-9  # on |c - E[X | cell]|∞ in units of 1/√d; far below float32 resolution, above the betainc noise floor
_LLOYD_WARMUP = 20  # plain Lloyd steps before Newton takes over
_STORED_TOLERANCE = 1e-6  # a cache file's |c - E[X | cell]|∞ (units of 1/√d) must be below this to be used


@dataclass(frozen=True, eq=False)
class Codebook:
    """A 2^b-level scalar quantizer for one rotated coordinate.

    Attributes:
        dim: vector dimension d the density is for.
        bits: b; there are 2^b centroids.
        density: ``"exact"`` (f_d on [-1, 1]) or ``"gaussian"`` (N(0, 1/d)).
        centroids: (2^b,) float64, sorted ascending, symmetric about 0.
        boundaries: (2^b - 1,) float64 midpoints between consecutive centroids (decision thresholds).
        mse: d · E[(X - c(X))²], i.e. D_mse of a unit vector under TurboQuant_mse.
    """

    dim: int
    bits: int
    density: str
    centroids: np.ndarray
    boundaries: np.ndarray
    mse: float

    def centroids_tensor(self, device: torch.device | str | None = None,
                         dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.as_tensor(self.centroids, dtype=dtype, device=device)

    def boundaries_tensor(self, device: torch.device | str | None = None,
                          dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.as_tensor(self.boundaries, dtype=dtype, device=device)

    def __repr__(self) -> str:
        return f"Codebook(dim={self.dim}, bits={self.bits}, density={self.density!r}, mse={self.mse:.6g})"


class _IntervalMoments:
    """P(cell), E[X; cell] and E[X²; cell] for the cells (t_(i-1), t_i] of a coordinate density."""

    def __init__(self, dim: int, density: str):
        self.dim = dim
        self.density = density
        self.a = (dim - 1) / 2.0
        self.sigma = 1.0 / np.sqrt(dim)

    def cumulative(self, t: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(P(X ≤ t), E[X; X ≤ t], E[X²; X ≤ t]) at each threshold t (±inf allowed)."""
        if self.density == "gaussian":
            z = t / self.sigma
            cdf = stats.norm.cdf(z)
            finite = np.isfinite(z)
            pdf = np.where(finite, stats.norm.pdf(np.where(finite, z, 0.0)), 0.0)
            zpdf = np.where(finite, np.where(finite, z, 0.0) * pdf, 0.0)
            first = -self.sigma * pdf
            second = self.sigma ** 2 * (cdf - zpdf)
            return cdf, first, second
        a = self.a
        u = np.clip((1.0 + t) / 2.0, 0.0, 1.0)
        p0 = special.betainc(a, a, u)
        b1 = 0.5 * special.betainc(a + 1.0, a, u)                      # E[B; B ≤ u]
        b2 = a * (a + 1.0) / (2.0 * a * (2.0 * a + 1.0)) * special.betainc(a + 2.0, a, u)  # E[B²; B ≤ u]
        # X = 2B - 1:  E[X] = 2E[B] - P,  E[X²] = 4E[B²] - 4E[B] + P
        return p0, 2.0 * b1 - p0, 4.0 * b2 - 4.0 * b1 + p0

    def pdf(self, t: np.ndarray) -> np.ndarray:
        """The coordinate density at t."""
        if self.density == "gaussian":
            return stats.norm.pdf(t / self.sigma) / self.sigma
        return 0.5 * stats.beta.pdf((1.0 + t) / 2.0, self.a, self.a)

    def cells(self, boundaries: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        edges = np.concatenate(([-np.inf], boundaries, [np.inf]))
        p, m1, m2 = self.cumulative(edges)
        return np.diff(p), np.diff(m1), np.diff(m2)


def _initial_centroids(moments: _IntervalMoments, bits: int) -> np.ndarray:
    """Panter-Dite start: the high-resolution optimum places levels with point density ∝ f^(1/3).
    For N(0, 1/d) that is N(0, 3/d); for f_d ∝ (1 - x²)^(a-1) it is the same family with
    a' = (a + 2)/3. Take its quantiles at the cell mid-probabilities."""
    levels = 2 ** bits
    probs = (np.arange(levels) + 0.5) / levels
    if moments.density == "gaussian":
        return stats.norm.ppf(probs) * np.sqrt(3.0) * moments.sigma
    a_companded = (moments.a + 2.0) / 3.0
    return 2.0 * stats.beta.ppf(probs, a_companded, a_companded) - 1.0


def _newton_step(moments: _IntervalMoments, centroids: np.ndarray) -> tuple[np.ndarray, float]:
    """One Newton step on F(c) = c - E[X | cell(c)] (Lloyd-Max's fixed point), and |F|∞ before it.

    With t_i = (c_i + c_(i+1))/2 and m_i the conditional mean of cell i = (t_(i-1), t_i],
    ∂m_i/∂t_i = f(t_i)(t_i - m_i)/P_i and ∂m_i/∂t_(i-1) = f(t_(i-1))(m_i - t_(i-1))/P_i, so the
    Jacobian I - ∂m/∂c is tridiagonal and each step costs O(2^b).
    """
    boundaries = 0.5 * (centroids[1:] + centroids[:-1])
    p, m1, _ = moments.cells(boundaries)
    means = m1 / p
    residual = centroids - means
    f_t = moments.pdf(boundaries)
    d_upper = np.zeros_like(centroids)   # ∂m_i/∂t_i, cells 0..L-2
    d_lower = np.zeros_like(centroids)   # ∂m_i/∂t_(i-1), cells 1..L-1
    d_upper[:-1] = f_t * (boundaries - means[:-1]) / p[:-1]
    d_lower[1:] = f_t * (means[1:] - boundaries) / p[1:]
    diagonal = 1.0 - 0.5 * (d_upper + d_lower)
    banded = np.zeros((3, centroids.size))
    banded[0, 1:] = -0.5 * d_upper[:-1]   # J[i, i+1]
    banded[1] = diagonal
    banded[2, :-1] = -0.5 * d_lower[1:]   # J[i+1, i]
    step = linalg.solve_banded((1, 1), banded, -residual)
    return centroids + step, float(np.max(np.abs(residual)))


def _solve_lloyd_max(dim: int, bits: int, density: str) -> tuple[np.ndarray, np.ndarray, float]:
    """Lloyd iterations to get near the fixed point, then safeguarded Newton to machine precision."""
    moments = _IntervalMoments(dim, density)
    centroids = _initial_centroids(moments, bits)
    scale = moments.sigma
    for iteration in range(_MAX_ITERATIONS):
        boundaries = 0.5 * (centroids[1:] + centroids[:-1])
        p, m1, _ = moments.cells(boundaries)
        lloyd = m1 / p
        residual = float(np.max(np.abs(lloyd - centroids))) / scale
        if residual < _TOLERANCE:
            break
        candidate = lloyd
        if iteration >= _LLOYD_WARMUP:
            newton, _ = _newton_step(moments, centroids)
            if np.all(np.diff(newton) > 0):
                candidate = newton
        centroids = 0.5 * (candidate - candidate[::-1])  # the density is symmetric: keep the codebook so
    boundaries = 0.5 * (centroids[1:] + centroids[:-1])
    return centroids, boundaries, _distortion(moments, centroids, boundaries)


def _distortion(moments: _IntervalMoments, centroids: np.ndarray, boundaries: np.ndarray) -> float:
    """d · E[(X - c(X))²] = d · Σ_i (E[X²; cell i] - 2 c_i E[X; cell i] + c_i² P(cell i))."""
    p, m1, m2 = moments.cells(boundaries)
    return moments.dim * float(np.sum(m2 - 2.0 * centroids * m1 + centroids ** 2 * p))


def _validate(dim: int, bits: int, density: str) -> tuple[int, int, str]:
    return (check_int(dim, "dim", low=2), check_int(bits, "bits", 1, MAX_BITS),
            check_choice(density, "density", SUPPORTED_DENSITIES))


def cache_dir() -> Path:
    """Directory of on-disk caches: $TURBOQUANT_CACHE_DIR, else the user cache dir."""
    override = os.environ.get("TURBOQUANT_CACHE_DIR")
    if override:
        return Path(override).expanduser()
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("turboquant-repro"))


def _disk_path(dim: int, bits: int, density: str) -> Path:
    key = hashlib.sha1(f"v{_CACHE_VERSION}-{density}-{dim}-{bits}".encode()).hexdigest()[:10]
    return cache_dir() / "codebooks" / f"{density}_d{dim}_b{bits}_{key}.npz"


def _read_stored(path: Path, dim: int, bits: int, density: str) -> Codebook:
    """The codebook in cache file ``path``, checked to be the Lloyd-Max fixed point for (dim, bits, density).

    ValueError (naming what is wrong) if the file is unreadable, lacks an array, has the wrong shapes or
    dtypes, or holds centroids that are not the conditional means of their cells (to _STORED_TOLERANCE / √d)
    or an ``mse`` that is not theirs: a truncated, empty, bit-flipped or foreign file is never used.
    """
    levels = 2 ** bits
    try:
        with np.load(path, allow_pickle=False) as stored:
            arrays = {name: np.asarray(stored[name]) for name in ("centroids", "boundaries", "mse")}
    except (OSError, EOFError, KeyError, ValueError, zipfile.BadZipFile) as error:
        raise ValueError(f"not a readable codebook file ({type(error).__name__}: {error})") from error
    centroids, boundaries, mse = arrays["centroids"], arrays["boundaries"], arrays["mse"]
    for name, array, shape in (("centroids", centroids, (levels,)), ("boundaries", boundaries, (levels - 1,)),
                               ("mse", mse, ())):
        if array.dtype != np.float64 or array.shape != shape or not np.all(np.isfinite(array)):
            raise ValueError(f"{name} must be finite float64 of shape {shape}, got {array.dtype} {array.shape}")
    moments = _IntervalMoments(dim, density)
    if not np.array_equal(boundaries, 0.5 * (centroids[1:] + centroids[:-1])):
        raise ValueError("boundaries are not the midpoints of the centroids")
    if not np.all(np.diff(centroids) > 0):
        raise ValueError("centroids are not sorted and distinct")
    p, m1, _ = moments.cells(boundaries)
    residual = float(np.max(np.abs(m1 / p - centroids))) / moments.sigma
    if not residual < _STORED_TOLERANCE:
        raise ValueError(f"centroids are not the Lloyd-Max fixed point for dim={dim}, bits={bits}, "
                         f"density={density!r} (|c - E[X | cell]| = {residual:.3g}/√d)")
    expected = _distortion(moments, centroids, boundaries)
    if not abs(float(mse) - expected) <= 1e-9 * expected:
        raise ValueError(f"mse {float(mse)!r} is not the centroids' distortion {expected!r}")
    return Codebook(dim, bits, density, centroids, boundaries, float(mse))


def _write_stored(path: Path, codebook: Codebook) -> None:
    """Write ``codebook`` to ``path`` atomically (a temporary file renamed over it, removed on any failure);
    a read-only cache directory only costs recomputation in later processes."""
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.npz")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(tmp, centroids=codebook.centroids, boundaries=codebook.boundaries, mse=codebook.mse)
        os.replace(tmp, path)
    except OSError:
        pass
    finally:
        tmp.unlink(missing_ok=True)


def lloyd_max_codebook(dim: int, bits: int, density: str = "exact") -> Codebook:
    """The optimal 2^b-level scalar quantizer for a rotated coordinate (paper Eq. 4, Lemma 1).

    Cached in memory and on disk (see :func:`cache_dir`), so only the first call for a (d, b, density)
    solves the fixed point. A cache file is checked when read (see :func:`_read_stored`); a bad one is
    recomputed and replaced, with a warning naming it.

    Args:
        dim: vector dimension d ≥ 2.
        bits: b in [1, 8].
        density: ``"exact"`` for f_d(x) ∝ (1 - x²)^((d-3)/2) on [-1, 1], ``"gaussian"`` for N(0, 1/d).
    """
    return _cached_codebook(*_validate(dim, bits, density))


@functools.lru_cache(maxsize=None)
def _cached_codebook(dim: int, bits: int, density: str) -> Codebook:
    path = _disk_path(dim, bits, density)
    if path.exists():
        try:
            return _read_stored(path, dim, bits, density)
        except ValueError as problem:
            warnings.warn(f"codebook cache file {path} is invalid ({problem}); recomputing and replacing it",
                          RuntimeWarning, stacklevel=3)
    codebook = Codebook(dim, bits, density, *_solve_lloyd_max(dim, bits, density))
    _write_stored(path, codebook)
    return codebook


_HOST_TABLES: dict[int, tuple[weakref.ref, int | None, torch.Tensor]] = {}


def host_codebook(centroids: torch.Tensor) -> torch.Tensor:
    """The codebook as a flat fp16 CPU tensor, read back from the device once per tensor (kept while the same tensor
    is alive and unmodified), so a CUDA-graph capture may ask only about a table it has asked about before. An
    inference tensor (made under ``torch.inference_mode``) has no version counter: its copy is kept while it is
    alive, so a table changed in place inside inference mode is not read again."""
    version = None if centroids.is_inference() else centroids._version
    seen = _HOST_TABLES.get(id(centroids))
    if seen is not None and seen[0]() is centroids and seen[1] == version:
        return seen[2]
    if centroids.is_cuda and torch.cuda.is_current_stream_capturing():
        raise ValueError("a kernel reads the codebook back to the host once, which a CUDA-graph capture cannot: call "
                         "the kernel once before capturing (or build the cache format first)")
    table = centroids.detach().to("cpu", torch.float16).flatten()
    key = id(centroids)
    _HOST_TABLES[key] = (weakref.ref(centroids, lambda _, key=key: _HOST_TABLES.pop(key, None)), version, table)
    return table


def symmetric_codebook(centroids: torch.Tensor) -> bool:
    """True when ``centroids`` are sorted and symmetric in fp16, ``c[2^b - 1 - i] == -c[i]`` (the Lloyd-Max
    codebook): what the register decoders assume. Reads the table through :func:`host_codebook`."""
    if centroids.numel() <= 1:
        return True
    table = host_codebook(centroids)
    return torch.equal(table, -table.flip(0)) and bool((table[1:] > table[:-1]).all())
