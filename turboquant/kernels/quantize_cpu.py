"""Fused CPU TurboQuant_mse encoder (Algorithm 1, lines 5-7) with numba: vectors -> packed codes + norms.

The torch path (``TurboQuantMSE(backend="torch")``) spends its time in three places on a CPU: the
rotation (a dense d×d matmul, or the randomized Hadamard as a few Kronecker-factored GEMMs), a
``torch.bucketize`` pass and the packing shifts, each over a full (n, d) float32 intermediate. Here one
compiled loop per vector does everything while the vector sits in L1 (parallel over vectors):

    n = ||x||,  u = x / n,
    y = Π u                          (randomized Hadamard: per round a gather by the permutation, the
                                      signs and a constant-geometry fast Walsh-Hadamard transform,
                                      O(d log d); any other rotation: one BLAS matmul per chunk in
                                      torch, then the fused tail below),
    idx_j = #{k : t_k < y_j}         (nearest Lloyd-Max centroid, Eq. 4: one look-up in a table of
                                      equal cells over [-1, 1] plus one comparison, exact; see
                                      :func:`nearest_centroid_cells`),
    codes = the idx_j as the library's little-endian b-bit stream (``turboquant.pack_codes``).

Exactness. Arithmetic is float32 like the torch path and the midpoints are the same float32 values,
so ``idx`` is exactly ``torch.bucketize``'s for the same ``y``. With a Haar (or any dense) rotation the
normalisation and the matmul are torch's own, so the codes are bit-identical to the torch path. The
Hadamard transform here sums in butterfly order (torch multiplies 64-wide Hadamard blocks) and the
norm is a BLAS float32 dot product, so ``y`` differs by float32 rounding (~1e-7 relative) and a
coordinate within that distance of a midpoint may take the neighbouring code;
``tests/kernels/test_quantize_cpu.py`` counts and bounds those.

Threads: the parallel loops run on ``threads`` numba threads (default ``torch.get_num_threads()``,
capped by ``numba.config.NUMBA_NUM_THREADS``). Functions are compiled on first use and cached on disk
(``cache=True``), so the compile is paid once per machine.
"""
from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Iterator

import numba
import numpy as np
import torch
from numba import njit, prange

from ..packing import pack_codes, packed_size
from .._validation import unit_vectors
from ..rotation import RandomizedHadamard, Rotation

__all__ = [
    "bucketize_pack",
    "hadamard_quantize",
    "hadamard_rotate",
    "hadamard_state",
    "nearest_centroid_cells",
    "quantize_mse_cpu",
    "quantize_prod_cpu",
    "resolve_threads",
]

_ROWS_PER_TASK = 32  # vectors per parallel task: scratch buffers are allocated once per task
_SUPPORTED_INPUTS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_NO_CENTROIDS = np.zeros(1, np.float32)  # bucketize_pack's centroids when no residual is wanted


# ----------------------------------------------------------------------------------- per-vector steps
@njit(cache=True)
def _nearest_indices(y, cell_base, cell_midpoint, cell_scale, cell_offset, indices):
    """indices[j] = #{k : t_k < y[j]} (nearest Lloyd-Max centroid) through the cell table of
    :func:`nearest_centroid_cells`: one table look-up and one comparison per coordinate."""
    last = cell_base.shape[0] - 1
    for j in range(y.shape[0]):
        value = y[j]
        cell = min(max(np.int32(value * cell_scale + cell_offset), 0), last)
        indices[j] = cell_base[cell] + (value > cell_midpoint[cell])


@njit(cache=True)
def _pack_indices(indices, bits, out):
    """Write indices (length 8·⌈d/8⌉, zero past d) as the library's little-endian b-bit stream ``out``.

    Every 8 codes fill exactly ``bits`` bytes (code j at stream bits [j·b, (j+1)·b)), as in ``pack_codes``.
    """
    nbytes = out.shape[0]
    if 8 % bits == 0:  # whole codes per byte, low bits first
        per_byte = 8 // bits
        for byte in range(nbytes):
            word = np.uint32(0)
            for slot in range(per_byte):
                word |= np.uint32(indices[byte * per_byte + slot]) << np.uint32(slot * bits)
            out[byte] = word
    else:  # a group of 8 codes is one 8b-bit word, written as b bytes
        for group in range(indices.shape[0] // 8):
            word = np.uint64(0)
            for slot in range(8):
                word |= np.uint64(indices[group * 8 + slot]) << np.uint64(slot * bits)
            for byte in range(bits):
                if group * bits + byte < nbytes:
                    out[group * bits + byte] = (word >> np.uint64(8 * byte)) & np.uint64(0xFF)


@njit(cache=True)
def _radix4_pass(src, dst, quarter, factor):
    """Two constant-geometry Walsh-Hadamard levels in one pass over src[:4q] -> dst[:4q] (q = ``quarter``).

    One radix-2 level is dst[j] = src[2j] + src[2j+1], dst[j + p/2] = src[2j] − src[2j+1] (H_p is this
    sparse factor to the power log2 p); two of them map (a, b, c, d) = src[4j:4j+4] to
    dst[j], dst[j+q], dst[j+2q], dst[j+3q] = (a+b)+(c+d), (a−b)+(c−d), (a+b)−(c+d), (a−b)−(c−d),
    the same sums in the same order as the two levels. Scaled by ``factor``.
    """
    for j in range(quarter):
        a = src[4 * j]
        b = src[4 * j + 1]
        c = src[4 * j + 2]
        d = src[4 * j + 3]
        ab = a + b
        cd = c + d
        a_b = a - b
        c_d = c - d
        dst[j] = (ab + cd) * factor
        dst[j + quarter] = (a_b + c_d) * factor
        dst[j + 2 * quarter] = (ab - cd) * factor
        dst[j + 3 * quarter] = (a_b - c_d) * factor


@njit(cache=True)
def _radix2_pass(src, dst, half, factor):
    """One constant-geometry Walsh-Hadamard level src[:2h] -> dst[:2h] (h = ``half``), scaled by ``factor``."""
    for j in range(half):
        a = src[2 * j]
        b = src[2 * j + 1]
        dst[j] = (a + b) * factor
        dst[j + half] = (a - b) * factor


@njit(cache=True)
def _fwht(first, second, levels, scale):
    """H_p · first[:p] · scale with p = 2^levels (unnormalised Sylvester H_p), ping-ponging between
    ``first`` and ``second``; returns True when the result is in ``second`` (False: in ``first``).

    Each pass is a separate call with fixed (src, dst) roles: the compiler vectorizes a pass only when
    it can tell which buffer is read and which is written.
    """
    p = 1 << levels
    in_second = False
    done = 0
    while done < levels:
        pair = levels - done >= 2
        factor = scale if done + (2 if pair else 1) == levels else np.float32(1.0)
        if pair:
            if in_second:
                _radix4_pass(second, first, p // 4, factor)
            else:
                _radix4_pass(first, second, p // 4, factor)
            done += 2
        else:
            if in_second:
                _radix2_pass(second, first, p // 2, factor)
            else:
                _radix2_pass(first, second, p // 2, factor)
            done += 1
        in_second = not in_second
    if levels == 0:
        first[0] *= scale
    return in_second


@njit(cache=True)
def _norm(x):
    """||x|| as float32: the square root of the BLAS dot product x·x (float32 with vector partial sums)."""
    return np.float32(math.sqrt(np.dot(x, x)))


@njit(cache=True)
def _gather_signs(src, perm, sign, out):
    """out[i] = src[perm[i]] · sign[i]: the D_k P_k factor of one round."""
    for i in range(out.shape[0]):
        out[i] = src[perm[i]] * sign[i]


@njit(cache=True)
def _gather_unit_signs(src, divisor, perm, sign, out):
    """out[i] = (src[perm[i]] / divisor) · sign[i]: the first round, with the normalisation x/||x||
    folded in (a division, as the torch path rounds it)."""
    for i in range(out.shape[0]):
        out[i] = (src[perm[i]] / divisor) * sign[i]


@njit(cache=True)
def _unit_signs(src, divisor, sign, out):
    """out[i] = (src[i] / divisor) · sign[i]: the one round when d is a power of two (no permutation)."""
    for i in range(out.shape[0]):
        out[i] = (src[i] / divisor) * sign[i]


@njit(cache=True)
def _hadamard_rounds(x, divisor, bufs, signs, perms, block, levels, permute):
    """bufs[0] <- Π (x / divisor) for the randomized Hadamard (``RandomizedHadamard.apply``).

    Round k: g = D_k P_k v (gather by perms[k] if ``permute``, times signs[k]; v = x / divisor in the
    first round, bufs[0] after) into bufs[1], then H_p/√p (p = ``block`` = 2^levels) on its leading p
    coordinates, ping-ponging between bufs[1] and bufs[2]; the round's result is copied to bufs[0].
    """
    scale = np.float32(1.0 / math.sqrt(block))
    dim = bufs.shape[1]
    vector = bufs[0]
    gathered = bufs[1]
    scratch = bufs[2]
    for k in range(signs.shape[0]):
        if not permute:  # d a power of two: a single round, D_0 x / ||x||
            _unit_signs(x, divisor, signs[k], gathered)
        elif k == 0:
            _gather_unit_signs(x, divisor, perms[k], signs[k], gathered)
        else:
            _gather_signs(vector, perms[k], signs[k], gathered)
        head = scratch if _fwht(gathered, scratch, levels, scale) else gathered
        for i in range(block):
            vector[i] = head[i]
        for i in range(block, dim):
            vector[i] = gathered[i]


# ----------------------------------------------------------------------------------- parallel loops
@njit(cache=True, parallel=True)
def hadamard_quantize(x, signs, perms, block, levels, permute, cell_base, cell_midpoint, cell_scale, cell_offset,
                      bits, codes, norms):
    """codes[i], norms[i] for every row x[i] (float32): normalise, randomized Hadamard, bucketize, pack."""
    n, dim = x.shape
    tasks = (n + _ROWS_PER_TASK - 1) // _ROWS_PER_TASK
    for task in prange(tasks):
        bufs = np.empty((3, dim), np.float32)
        indices = np.zeros((dim + 7) // 8 * 8, np.uint8)
        for i in range(task * _ROWS_PER_TASK, min(n, (task + 1) * _ROWS_PER_TASK)):
            norm = _norm(x[i])
            norms[i] = norm
            _hadamard_rounds(x[i], norm if norm > 0 else np.float32(1.0), bufs, signs, perms, block, levels, permute)
            _nearest_indices(bufs[0], cell_base, cell_midpoint, cell_scale, cell_offset, indices)
            _pack_indices(indices, bits, codes[i])


@njit(cache=True, parallel=True)
def hadamard_rotate(x, signs, perms, block, levels, permute, out):
    """out[i] = Π x[i] (float32, no normalisation): the transform alone, for tests."""
    n, dim = x.shape
    tasks = (n + _ROWS_PER_TASK - 1) // _ROWS_PER_TASK
    for task in prange(tasks):
        bufs = np.empty((3, dim), np.float32)
        for i in range(task * _ROWS_PER_TASK, min(n, (task + 1) * _ROWS_PER_TASK)):
            _hadamard_rounds(x[i], np.float32(1.0), bufs, signs, perms, block, levels, permute)
            for j in range(dim):
                out[i, j] = bufs[0, j]


@njit(cache=True, parallel=True)
def bucketize_pack(y, cell_base, cell_midpoint, cell_scale, cell_offset, bits, codes, centroids, residual):
    """codes[i] = the packed nearest-centroid indices of the rotated unit vector y[i] (float32); with
    ``residual``, also y[i] <- y[i] − centroids[indices] in place (TurboQuant_prod's residual, rotated)."""
    n, dim = y.shape
    tasks = (n + _ROWS_PER_TASK - 1) // _ROWS_PER_TASK
    for task in prange(tasks):
        indices = np.zeros((dim + 7) // 8 * 8, np.uint8)
        for i in range(task * _ROWS_PER_TASK, min(n, (task + 1) * _ROWS_PER_TASK)):
            _nearest_indices(y[i], cell_base, cell_midpoint, cell_scale, cell_offset, indices)
            _pack_indices(indices, bits, codes[i])
            if residual:
                row = y[i]
                for j in range(dim):
                    row[j] -= centroids[indices[j]]


def nearest_centroid_cells(boundaries: np.ndarray | tuple[float, ...], radius: float = 1.0 + 1e-2,
                           margin: float = 1e-6) -> tuple[np.ndarray, np.ndarray, np.float32, np.float32]:
    """Cell table for an exact nearest-centroid search in one look-up: ``(base, midpoint, scale, offset)``.

    [−radius, radius] (|y_j| ≤ 1 for a rotated unit vector) is cut into equal cells narrow enough that
    each cell widened by ``margin`` on both sides holds at most one midpoint. For a coordinate y,
    ``cell = clip(int(y·scale + offset))`` and ``idx = base[cell] + (y > midpoint[cell])``, where
    base[c] counts the midpoints below the widened cell and midpoint[c] is the one inside it (+inf if
    none). The float32 cell arithmetic errs by ≪ ``margin``, so y always lies in its cell's widened
    interval and idx equals #{k : t_k < y} exactly (``torch.bucketize``), ties included; values beyond
    ±radius clip to the end cells, which hold every / no midpoint below them.
    """
    bnd = np.asarray(boundaries, dtype=np.float32).astype(np.float64)
    if bnd.ndim != 1 or bnd.size == 0 or np.any(np.diff(bnd) <= 0) or np.any(np.abs(bnd) >= 1):
        raise ValueError("boundaries must be sorted, distinct midpoints inside (-1, 1)")
    gap = float(np.min(np.diff(bnd))) if bnd.size > 1 else 2.0
    if gap <= 4 * margin:
        raise ValueError(f"midpoints {gap:.3g} apart are too close for a cell table with margin {margin}")
    cells = int(np.ceil(2 * radius / ((gap - 2 * margin) / 2)))
    width = 2 * radius / cells
    low = -radius + width * np.arange(cells)
    base = np.searchsorted(bnd, low - margin, side="left")
    above = np.searchsorted(bnd, low + width + margin, side="right")
    if np.any(above - base > 1):
        raise AssertionError("cell table too coarse: a widened cell holds two midpoints")
    midpoint = np.where(above > base, bnd[np.minimum(base, bnd.size - 1)], np.inf)
    return (base.astype(np.int32), midpoint.astype(np.float32),
            np.float32(1.0 / width), np.float32(radius / width))


# ----------------------------------------------------------------------------------- entry point
def resolve_threads(threads: int | None) -> int:
    """The numba thread count to use: ``threads`` or torch's intra-op count, at most numba's pool size."""
    wanted = torch.get_num_threads() if threads is None else int(threads)
    if wanted < 1:
        raise ValueError(f"threads must be positive, got {threads}")
    return min(wanted, numba.config.NUMBA_NUM_THREADS)


def hadamard_state(rotation: RandomizedHadamard) -> tuple[np.ndarray, np.ndarray, int, int, bool]:
    """(signs (rounds, d) float32, permutations (rounds, d) uint32, block p, log2 p, whether to permute):
    the arguments that :func:`hadamard_quantize` / :func:`hadamard_rotate` take for ``rotation``.

    The permutations are unsigned so that numba's gathers skip the negative-index wrap-around test
    (benchmarks/NOTES.md, "Constants")."""
    signs = np.ascontiguousarray(rotation.signs.cpu().numpy(), dtype=np.float32)
    perms = np.ascontiguousarray(rotation.permutations.cpu().numpy(), dtype=np.uint32)
    block = int(rotation.block)
    return signs, perms, block, block.bit_length() - 1, rotation.rounds > 1


@functools.lru_cache(maxsize=64)
def _cached_cells(boundaries: tuple[float, ...]) -> tuple[np.ndarray, np.ndarray, np.float32, np.float32]:
    return nearest_centroid_cells(np.asarray(boundaries, dtype=np.float32))


def _cells_for(boundaries: torch.Tensor | np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray, np.float32, np.float32]:
    """Validated ``bits`` and midpoints -> the (cached) cell table of :func:`nearest_centroid_cells`."""
    if isinstance(bits, bool) or not isinstance(bits, int) or not 1 <= bits <= 8:
        raise ValueError(f"bits must be an integer in [1, 8], got {bits!r}")
    bnd = np.asarray(torch.as_tensor(boundaries).cpu().numpy(), dtype=np.float32)
    if bnd.shape != ((1 << bits) - 1,):
        raise ValueError(f"boundaries must be {(1 << bits) - 1} sorted midpoints for {bits} bits, got shape {bnd.shape}")
    return _cached_cells(tuple(bnd.tolist()))


@contextlib.contextmanager
def _numba_threads(threads: int | None) -> Iterator[None]:
    """Run the block on :func:`resolve_threads` numba threads, restoring numba's count afterwards."""
    previous = numba.get_num_threads()
    numba.set_num_threads(resolve_threads(threads))
    try:
        yield
    finally:
        numba.set_num_threads(previous)


def _rotated_unit_rows(rows: torch.Tensor, rotation: Rotation,
                       hadamard: tuple[np.ndarray, np.ndarray, int, int, bool] | None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(Π (x / ||x||), ||x||)`` for float32 CPU rows: the fused transform when ``hadamard`` (the randomized
    Hadamard's :func:`hadamard_state`) is given, else ``rotation.apply``; rotated rows float32, contiguous."""
    unit, norms = unit_vectors(rows)
    if hadamard is None:
        return rotation.apply(unit.to(rotation.device)).cpu().contiguous(), norms
    rotated = np.empty(unit.shape, np.float32)
    hadamard_rotate(unit.numpy(), *hadamard, rotated)
    return torch.from_numpy(rotated), norms


def _as_rows(x: torch.Tensor, dim: int) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or x.dtype not in _SUPPORTED_INPUTS:
        raise ValueError(f"x must be a float16/bfloat16/float32/float64 torch.Tensor, got {getattr(x, 'dtype', type(x))}")
    if x.device.type != "cpu":
        raise ValueError(f"the numba encoder runs on CPU tensors, got one on {x.device}")
    if x.ndim == 0 or x.shape[-1] != dim:
        raise ValueError(f"x must have last dimension {dim}, got shape {tuple(x.shape)}")
    return x.reshape(-1, dim).to(torch.float32).contiguous()


def quantize_mse_cpu(x: torch.Tensor, rotation: Rotation, boundaries: torch.Tensor | np.ndarray, bits: int,
                     chunk_size: int = 16384, threads: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """TurboQuant_mse codes of the rows of ``x`` (…, d) on the CPU: ``(codes uint8 (…, ⌈d·b/8⌉), norms float32 (…))``.

    ``boundaries`` are the 2^b − 1 sorted Lloyd-Max midpoints (``Codebook.boundaries``). A
    :class:`~turboquant.rotation.RandomizedHadamard` is applied inside the fused loop; any other rotation
    by ``rotation.apply`` (one BLAS matmul for Haar) on chunks of ``chunk_size`` rows, followed by the
    fused bucketize-and-pack loop. The layout is exactly ``TurboQuantMSE.quantize``'s.
    """
    dim = rotation.dim
    cells = _cells_for(boundaries, bits)
    lead = x.shape[:-1]
    rows = _as_rows(x, dim)
    n = rows.shape[0]
    codes = np.empty((n, packed_size(dim, bits)), dtype=np.uint8)
    norms = np.empty(n, dtype=np.float32)
    with _numba_threads(threads):
        if isinstance(rotation, RandomizedHadamard):
            hadamard_quantize(rows.numpy(), *hadamard_state(rotation), *cells, bits, codes, norms)
        else:
            for start in range(0, n, chunk_size):
                rotated, chunk_norms = _rotated_unit_rows(rows[start:start + chunk_size], rotation, None)
                bucketize_pack(rotated.numpy(), *cells, bits, codes[start:start + chunk_size], _NO_CENTROIDS, False)
                norms[start:start + chunk_size] = chunk_norms.numpy()
    return (torch.from_numpy(codes).reshape(*lead, codes.shape[1]), torch.from_numpy(norms).reshape(lead))


def quantize_prod_cpu(x: torch.Tensor, rotation: Rotation, boundaries: torch.Tensor | np.ndarray,
                      centroids: torch.Tensor | np.ndarray, mse_bits: int, sketch_rotated: torch.Tensor,
                      chunk_size: int = 16384, threads: int | None = None,
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """TurboQuant_prod (Algorithm 2) on the CPU: ``(codes, sign bits, norms, residual norms)`` as
    ``TurboQuantProd.quantize`` lays them out, for rows of ``x`` (…, d) and ``mse_bits`` ≥ 1.

    The residual is formed in the rotated basis, where the MSE stage already is: with y = Π u and
    ỹ = c[idx], r = u − Πᵀỹ = Πᵀ(y − ỹ), so ‖r‖ = ‖y − ỹ‖ and S r = (S Πᵀ)(y − ỹ). ``sketch_rotated``
    is that d×d matrix S Πᵀ (``rotation.apply(S)``, rows Π s_i), so no inverse rotation is needed: the
    randomized Hadamard (fused loop) or one BLAS matmul (any other rotation) gives y, one fused loop
    gives the codes and y − ỹ, and one matmul gives the sign bits (bit 1 for S r ≥ 0, as ``QJL``).
    """
    if mse_bits < 1:
        raise ValueError("quantize_prod_cpu needs an MSE stage (mse_bits >= 1)")
    dim = rotation.dim
    cells = _cells_for(boundaries, mse_bits)
    centroid_values = np.ascontiguousarray(torch.as_tensor(centroids).cpu().numpy(), dtype=np.float32)
    sketch = sketch_rotated.to(device="cpu", dtype=torch.float32)
    lead = x.shape[:-1]
    rows = _as_rows(x, dim)
    n = rows.shape[0]
    codes = np.empty((n, packed_size(dim, mse_bits)), dtype=np.uint8)
    signs = torch.empty(n, packed_size(dim, 1), dtype=torch.uint8)
    norms = torch.empty(n, dtype=torch.float32)
    residual_norms = torch.empty(n, dtype=torch.float32)
    hadamard = hadamard_state(rotation) if isinstance(rotation, RandomizedHadamard) else None
    with _numba_threads(threads):
        for start in range(0, n, chunk_size):
            part = slice(start, min(start + chunk_size, n))
            rotated, norms[part] = _rotated_unit_rows(rows[part], rotation, hadamard)
            bucketize_pack(rotated.numpy(), *cells, mse_bits, codes[part], centroid_values, True)
            residual_norms[part] = torch.linalg.vector_norm(rotated, dim=-1)
            signs[part] = pack_codes((rotated @ sketch.T >= 0).to(torch.uint8), 1, check_range=False)
    return (torch.from_numpy(codes).reshape(*lead, codes.shape[1]), signs.reshape(*lead, signs.shape[1]),
            norms.reshape(lead), residual_norms.reshape(lead))
