"""Fused TurboQuant_mse quantization (Algorithm 1, lines 5-7): vectors -> packed codes + norms, one pass.

For each row x the kernel computes, without writing any intermediate to memory:

    n = ||x||,   y = Pi (x / n)   (a tensor-core matmul with the dense rotation, fp16 operands, fp32 sum),
    idx_j = #{k : y_j > t_k}      (nearest centroid: t_k are the Lloyd-Max midpoints, Eq. 4),

packs ``idx`` into the library's little-endian bit stream (see ``_layout``) and stores ``n``.

Nearest centroid without a compare per midpoint. A chain of 2^b - 1 comparisons costs ~30 integer
ops per coordinate at b = 4, several times what a byte-bound kernel can issue per coordinate. Instead ``y`` is
mapped to a cell of a fine uniform grid over [-1, 1] (|y_j| <= 1 for a unit vector) fine enough that each cell
holds at most one midpoint; a small table gives, per cell, the code of the cell's lower edge and that midpoint, so ``idx = base[cell] + (y > t[cell])``: one FMA, one
table load (L1-resident), one compare. The cell index is the low bits of ``y * a + (c + 1.5 * 2^23)``
read as an int (round-to-nearest by the FMA itself, no float-to-int conversion). Both are packed into
one int32 entry: the midpoint as float32 with its 4 low mantissa bits replaced by the base code, which
moves the midpoint by < 16 ulp (~1e-7 at |t| ~ 0.1), far below the fp16 rounding of ``y``.

Or, with ``nearest="tree"``, no memory access at all: the Lloyd-Max midpoints are symmetric (t_{2^b-2-k} = -t_k,
the middle one 0), so with ``h = 2^(b-1)`` and ``j = #{positive midpoints < |y|}`` (a branch-free binary search
over the h - 1 positive midpoints held as scalars: b - 1 compares and selects), ``idx = h + j`` for y > 0 and
``h - 1 - j`` otherwise (:func:`_tree_codes`). ``nearest_operands`` builds either variant's table argument.

Exactness: ``y`` is computed from fp16-rounded operands, so a coordinate within ~1e-3 * |y| of a
midpoint may land in the neighbouring cell of the float64 reference; elsewhere the codes are bit-exact.
Measured speed and its limits: ``benchmarks/NOTES.md``.
"""
from __future__ import annotations

import functools

import numpy as np
import torch
import triton
import triton.language as tl

from ..backends import gluon_unavailable, quantize_kernel
from ..packing import packed_size
from ._layout import (
    as_rows,
    check_device,
    group_geometry,
    num_groups,
    pow2_at_least,
    store_group_words,
)

_MAGIC = 12582912.0  # 1.5 * 2**23: adding it to 0 <= u < 2**22 leaves round(u) in the low mantissa bits
_CODE_BITS = 4       # low mantissa bits of a table entry holding the base code (bits <= 4)
_ABOVE_ALL = 4.0     # "no midpoint in this cell": larger than any |y_j| <= 1


def _as_numpy(values: np.ndarray | torch.Tensor) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu()
    return np.asarray(values, dtype=np.float64)


def nearest_centroid_table(boundaries: np.ndarray | torch.Tensor) -> tuple[torch.Tensor, float, float]:
    """Cell table for the kernel's nearest-centroid lookup.

    Returns ``(table, scale, offset)``: for a coordinate ``y`` in [-1, 1], ``cell`` is the low bits of
    ``float32(y * scale + offset)`` and ``idx = (table[cell] & 15) + (y > as_float(table[cell] & ~15))``
    equals ``#{k : y > boundaries[k]}`` except within ~1e-7 of a midpoint.
    """
    bnd = _as_numpy(boundaries)
    if bnd.ndim != 1 or bnd.size + 1 > 2 ** _CODE_BITS or np.any(np.diff(bnd) <= 0):
        raise ValueError(f"boundaries must be a sorted 1-D array of at most {2 ** _CODE_BITS - 1} midpoints")
    if np.any(np.abs(bnd) >= 1.0):
        raise ValueError("midpoints of a unit-sphere codebook lie in (-1, 1)")
    half_range = 1.0 + 1e-3
    min_gap = np.min(np.diff(bnd)) if bnd.size > 1 else 2.0
    cells = max(64, triton.next_power_of_2(int(np.ceil(4 * half_range / min_gap)) + 2))
    scale = (cells - 2) / (2 * half_range)             # u = (y + R) * scale + 1 lies in [1, cells - 1]
    origin = 1.0 + half_range * scale
    edges_lo = (np.arange(cells) - 0.5 - origin) / scale
    edges_hi = edges_lo + 1.0 / scale
    base = np.searchsorted(bnd, edges_lo, side="left")  # midpoints strictly below the cell (ties: neighbour)
    inside = np.searchsorted(bnd, edges_hi, side="left") - base
    if np.any(inside > 1):
        raise AssertionError("cell table too coarse: a cell holds two midpoints")
    threshold = np.where(inside == 1, bnd[np.minimum(base, bnd.size - 1)], _ABOVE_ALL).astype(np.float32)
    bits = threshold.view(np.int32) & ~np.int32(2 ** _CODE_BITS - 1)
    table = torch.from_numpy((bits | base.astype(np.int32)).astype(np.int32))
    return table, float(scale), float(origin + _MAGIC)


@triton.jit
def _nearest_centroid(y, table_ptr, lut_scale, lut_offset, LUT_MASK: tl.constexpr):
    """idx = #{k: y > t_k} via the cell table (see module docstring); y is float32, any shape."""
    cell = (y * lut_scale + lut_offset).to(tl.int32, bitcast=True) & LUT_MASK
    entry = tl.load(table_ptr + cell)
    threshold = (entry & ~15).to(tl.float32, bitcast=True)
    return (entry & 15) + (y > threshold).to(tl.int32)


@triton.jit
def _tree_codes(y, mid_ptr, BITS: tl.constexpr):
    """idx = #{k: y > t_k} for a symmetric codebook from its h - 1 positive midpoints ``mid_ptr[0..h-2]``
    (increasing, float32): sign of y, then a binary search of |y| among them (module docstring)."""
    HALF: tl.constexpr = 1 << (BITS - 1)
    a = tl.abs(y)
    if BITS == 1:
        j = tl.zeros(y.shape, dtype=tl.int32)
    elif BITS == 2:
        j = (a > tl.load(mid_ptr)).to(tl.int32)
    elif BITS == 3:
        c1 = a > tl.load(mid_ptr + 1)
        c0 = a > tl.where(c1, tl.load(mid_ptr + 2), tl.load(mid_ptr))
        j = c1.to(tl.int32) * 2 + c0.to(tl.int32)
    else:
        c2 = a > tl.load(mid_ptr + 3)
        c1 = a > tl.where(c2, tl.load(mid_ptr + 5), tl.load(mid_ptr + 1))
        t0 = tl.where(c2, tl.where(c1, tl.load(mid_ptr + 6), tl.load(mid_ptr + 4)),
                      tl.where(c1, tl.load(mid_ptr + 2), tl.load(mid_ptr)))
        j = c2.to(tl.int32) * 4 + c1.to(tl.int32) * 2 + (a > t0).to(tl.int32)
    return tl.where(y > 0, HALF + j, (HALF - 1) - j)


@triton.jit
def _codes(y, table_ptr, lut_scale, lut_offset, LUT_MASK: tl.constexpr, NEAREST: tl.constexpr,
           BITS: tl.constexpr):
    """Codes of ``y``: through the cell table (``NEAREST="table"``), the midpoint tree (``"tree"``), or
    ``"none"``: no nearest-centroid step (wrong codes: the low bits of the cell index), which the benchmark uses to
    attribute time to that step."""
    if NEAREST == "table":
        idx = _nearest_centroid(y, table_ptr, lut_scale, lut_offset, LUT_MASK)
    elif NEAREST == "tree":
        idx = _tree_codes(y, table_ptr, BITS)
    else:
        idx = (y * lut_scale + lut_offset).to(tl.int32, bitcast=True) & ((1 << BITS) - 1)
    return idx


def nearest_operands(boundaries: torch.Tensor | np.ndarray, nearest: str, device: torch.device,
                     ) -> tuple[torch.Tensor, float, float]:
    """``(table, lut_scale, lut_offset)`` kernel arguments of the nearest-centroid step ``nearest``: the cell table
    (:func:`nearest_centroid_table`) for ``"table"`` / ``"none"``, the positive midpoints (float32; scale and
    offset unused) for ``"tree"``, which needs symmetric midpoints. Built once per (midpoints, step, device) and
    kept: a host-to-device copy per launch would synchronise the stream at every call (a decode step quantizes
    each new token), and the kernels only read the table."""
    if nearest not in ("table", "tree", "none"):
        raise ValueError(f"the tile kernel's nearest step is 'table' or 'tree', got {nearest!r}")
    bnd = _as_numpy(boundaries)  # "none" reads the cell table too: one cached copy for both
    return _device_operands(bnd.tobytes(), "tree" if nearest == "tree" else "table", str(torch.device(device)))


@functools.lru_cache(maxsize=256)
def _device_operands(midpoints: bytes, nearest: str, device: str) -> tuple[torch.Tensor, float, float]:
    bnd = np.frombuffer(midpoints, dtype=np.float64)
    if nearest != "tree":
        table, lut_scale, lut_offset = nearest_centroid_table(bnd)
        return table.to(device), lut_scale, lut_offset
    if not np.allclose(bnd, -bnd[::-1], rtol=0, atol=1e-7) or np.any(np.diff(bnd) <= 0):
        raise ValueError("nearest='tree' needs sorted symmetric midpoints (a Lloyd-Max codebook); use 'table'")
    positive = bnd[bnd.size // 2 + 1:] if bnd.size > 1 else np.zeros(1)
    return torch.tensor(positive, dtype=torch.float32, device=device), 0.0, 0.0


@triton.jit
def _quantize_mse_kernel(
    x_ptr, rot_ptr, table_ptr, codes_ptr, norms_ptr,
    n_rows, dim, row_bytes, n_groups, groups_padded, stride_x, stride_codes,
    lut_scale, lut_offset,
    BITS: tl.constexpr, BYTES_PER_GROUP: tl.constexpr, CODES_PER_GROUP: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_G: tl.constexpr, LUT_MASK: tl.constexpr,
    SINGLE_K: tl.constexpr, RESIDENT: tl.constexpr, NEAREST: tl.constexpr,
):
    """Persistent grid over tiles of BLOCK_N rows.

    ``rot_ptr`` is the rotation in stream order (see ``stream_rotation``): (CODES_PER_GROUP, dim,
    groups_padded), slice k holding the rows ``g * CODES_PER_GROUP + k`` of Pi as columns, so
    ``x @ rot[k]`` gives code k of every group and the codes are OR-ed into the words directly.
    RESIDENT (two codes per group, one chunk: 4-bit with dim <= 128): both slices stay in registers
    for the whole persistent loop instead of being re-read from L2 for every tile.
    """
    pid = tl.program_id(0)
    n_tiles = tl.cdiv(n_rows, BLOCK_N)
    k_offs = tl.arange(0, BLOCK_K)
    if RESIDENT:
        g_all = tl.arange(0, BLOCK_G)
        rot_even = tl.load(rot_ptr + k_offs[:, None] * groups_padded + g_all[None, :],
                           mask=k_offs[:, None] < dim, other=0.0)
        rot_odd = tl.load(rot_ptr + dim * groups_padded + k_offs[:, None] * groups_padded + g_all[None, :],
                          mask=k_offs[:, None] < dim, other=0.0)
    for tile in range(pid, n_tiles, tl.num_programs(0)):
        rows = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        row_mask = rows < n_rows
        x_rows = x_ptr + rows.to(tl.int64) * stride_x
        if SINGLE_K:
            x = tl.load(x_rows[:, None] + k_offs[None, :],
                        mask=row_mask[:, None] & (k_offs[None, :] < dim), other=0.0).to(tl.float32)
            sum_sq = tl.sum(x * x, axis=1)
        else:
            sum_sq = tl.zeros((BLOCK_N,), dtype=tl.float32)
            for k0 in range(0, dim, BLOCK_K):
                xk = tl.load(x_rows[:, None] + (k0 + k_offs)[None, :],
                             mask=row_mask[:, None] & ((k0 + k_offs) < dim)[None, :], other=0.0).to(tl.float32)
                sum_sq += tl.sum(xk * xk, axis=1)
        norm = tl.sqrt(sum_sq)
        inv_norm = tl.where(norm > 0, 1.0 / tl.maximum(norm, 1e-30), 0.0)
        tl.store(norms_ptr + rows, norm.to(norms_ptr.dtype.element_ty), mask=row_mask)
        if SINGLE_K:
            x_unit = (x * inv_norm[:, None]).to(tl.float16)
        else:
            x_unit = inv_norm  # placeholder: the chunked path re-reads x for every K chunk
        code_rows = codes_ptr + rows.to(tl.int64) * stride_codes
        if RESIDENT:
            even = _codes(tl.dot(x_unit, rot_even), table_ptr, lut_scale, lut_offset, LUT_MASK, NEAREST, BITS)
            odd = _codes(tl.dot(x_unit, rot_odd), table_ptr, lut_scale, lut_offset, LUT_MASK, NEAREST, BITS)
            odd = tl.where((g_all * 2 + 1 < dim)[None, :], odd, 0)
            store_group_words(code_rows, row_mask, g_all, row_bytes, even | (odd << BITS), BYTES_PER_GROUP)
        else:
            _quantize_chunks(x_rows, row_mask, x_unit, inv_norm, code_rows, rot_ptr, table_ptr, dim,
                             row_bytes, n_groups, groups_padded, lut_scale, lut_offset,
                             BITS, BYTES_PER_GROUP, CODES_PER_GROUP, BLOCK_N, BLOCK_K, BLOCK_G, LUT_MASK, SINGLE_K,
                             NEAREST)


@triton.jit
def _quantize_chunks(x_rows, row_mask, x_unit, inv_norm, code_rows, rot_ptr, table_ptr, dim, row_bytes,
                     n_groups, groups_padded, lut_scale, lut_offset,
                     BITS: tl.constexpr, BYTES_PER_GROUP: tl.constexpr, CODES_PER_GROUP: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_G: tl.constexpr, LUT_MASK: tl.constexpr,
                     SINGLE_K: tl.constexpr, NEAREST: tl.constexpr):
    """Codes of one tile of rows, BLOCK_G groups at a time, re-reading the rotation slices (any width)."""
    k_offs = tl.arange(0, BLOCK_K)
    for g0 in range(0, n_groups, BLOCK_G):
        g_offs = tl.multiple_of(g0, BLOCK_G) + tl.arange(0, BLOCK_G)
        words = tl.zeros((BLOCK_N, BLOCK_G), dtype=tl.int32)
        for k in tl.static_range(CODES_PER_GROUP):
            rot_k = rot_ptr + k * dim * groups_padded + g_offs[None, :]
            if SINGLE_K:
                rot = tl.load(rot_k + k_offs[:, None] * groups_padded, mask=k_offs[:, None] < dim, other=0.0)
                y = tl.dot(x_unit, rot)
            else:
                y = tl.zeros((BLOCK_N, BLOCK_G), dtype=tl.float32)
                for k0 in range(0, dim, BLOCK_K):
                    kk = k0 + k_offs
                    xk = tl.load(x_rows[:, None] + kk[None, :],
                                 mask=row_mask[:, None] & (kk < dim)[None, :], other=0.0).to(tl.float32)
                    rot = tl.load(rot_k + kk[:, None] * groups_padded, mask=kk[:, None] < dim, other=0.0)
                    y = tl.dot((xk * inv_norm[:, None]).to(tl.float16), rot, y)
            codes = _codes(y, table_ptr, lut_scale, lut_offset, LUT_MASK, NEAREST, BITS)
            codes = tl.where((g_offs * CODES_PER_GROUP + k < dim)[None, :], codes, 0)
            words = words | (codes << (BITS * k))
        store_group_words(code_rows, row_mask, g_offs, row_bytes, words, BYTES_PER_GROUP)


def stream_rotation(rotation_matrix: torch.Tensor, bits: int, groups_padded: int) -> torch.Tensor:
    """Pi rearranged for the kernel: fp16 (codes_per_group, dim, groups_padded), [k, i, g] = Pi[g*cpg + k, i].

    Coordinates past ``dim`` (the last group's padding) get zero columns.
    """
    dim = rotation_matrix.shape[0]
    _, codes_per_group = group_geometry(bits)
    padded = torch.zeros(groups_padded * codes_per_group, dim, dtype=torch.float16, device=rotation_matrix.device)
    padded[:dim] = rotation_matrix.to(torch.float16)
    return padded.reshape(groups_padded, codes_per_group, dim).permute(1, 2, 0).contiguous()


def _check_inputs(x: torch.Tensor, rotation_matrix: torch.Tensor) -> int:
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"x must be float16, bfloat16 or float32, got {x.dtype}")
    dim = x.shape[-1]
    if rotation_matrix.shape != (dim, dim):
        raise ValueError(f"rotation_matrix must be ({dim}, {dim}) for x of dim {dim}, got {tuple(rotation_matrix.shape)}")
    if rotation_matrix.device != x.device:
        raise ValueError(f"rotation_matrix is on {rotation_matrix.device}, x on {x.device}")
    return dim


def wgmma_unsupported(x: torch.Tensor, bits: int) -> str | None:
    """Why the warpgroup-MMA kernels (:mod:`turboquant.kernels.quantize_wgmma`) cannot quantize ``x`` at ``bits``
    (with the device's Gluon checked first, so the Gluon module is imported only where it runs), or None."""
    reason = gluon_unavailable(x.device)
    if reason is None:
        from .quantize_wgmma import wgmma_quantize_unsupported

        reason = wgmma_quantize_unsupported(x, bits)
    return reason


def quantize_mse_triton(
    x: torch.Tensor,
    rotation_matrix: torch.Tensor,
    boundaries: torch.Tensor | np.ndarray,
    bits: int,
    norms_dtype: torch.dtype = torch.float32,
    *,
    block_n: int = 64,
    num_warps: int = 4,
    num_stages: int | None = None,
    programs_per_sm: int | None = None,
    lookup: bool = True,
    nearest: str | None = None,
    kernel: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """TurboQuant_mse codes and norms of ``x`` (..., dim) in one kernel.

    Args:
        x: float16 / bfloat16 / float32 vectors of any norm.
        rotation_matrix: dense (dim, dim) Pi with y = Pi x (``Rotation.matrix()``), any float dtype.
        boundaries: the codebook's 2^bits - 1 midpoints (``Codebook.boundaries``).
        bits: 1..4.
        norms_dtype: dtype of the stored norms (float32 as the library, float16 for a compact cache).
        block_n, num_warps, num_stages, programs_per_sm: tuning of the tile kernel (rows per tile, warps,
            software-pipeline depth of the row loads: default 3, persistent programs per SM: default 4); the wgmma
            kernel takes the last two (``num_stages``: the tiles of rows TMA keeps in flight in shared memory, at
            least 2, default 2; ``programs_per_sm`` default 3, its register budget and shared memory set to fit).
        lookup: False skips the nearest-centroid step and returns wrong codes (benchmark attribution only).
        nearest: the tile kernel's nearest-centroid step: ``"table"`` (cell-table gather, its default) or
            ``"tree"`` (midpoint binary search in registers, symmetric codebooks; module docstring). The wgmma kernel
            has one step, the midpoint tree on fp16 pairs (:func:`~turboquant.kernels.quantize_wgmma._f16x2_codes`).
        kernel: ``"tiles"`` (this module's kernel; the options above tune it), ``"wgmma"``
            (:mod:`turboquant.kernels.quantize_wgmma`, Gluon, Hopper only: float16 or bfloat16 rows of 128 channels,
            symmetric codebooks; ``block_n`` and ``num_warps`` unused) or ``"auto"``: ``"wgmma"`` where it serves
            (``turboquant.backends.quantize_kernel``), else ``"tiles"``; ``"tiles"`` as well when ``nearest`` is given
            or ``lookup`` is False (the tile kernel's own options).

    Returns:
        ``(codes, norms)``: uint8 (..., ceil(dim * bits / 8)) in the library's packed layout, and
        ``||x||`` (...,) in ``norms_dtype``.
    """
    check_device(x.device)
    dim = _check_inputs(x, rotation_matrix)
    bytes_per_group, codes_per_group = group_geometry(bits)
    if len(_as_numpy(boundaries)) != 2 ** bits - 1:
        raise ValueError(f"{bits}-bit codebook needs {2 ** bits - 1} boundaries")
    if nearest not in (None, "table", "tree"):
        raise ValueError(f"nearest must be None, 'table' or 'tree', got {nearest!r}")
    if kernel == "auto" and (nearest is not None or not lookup):
        kernel = "tiles"  # the tile kernel's own options were asked for
    if kernel == "wgmma" and (nearest is not None or not lookup):
        raise ValueError("the wgmma quantize kernel has one nearest-centroid step (the midpoint tree on fp16 pairs) "
                         f"and always looks up; nearest and lookup are the tile kernel's options, got "
                         f"nearest={nearest!r}, lookup={lookup}")
    if kernel != "tiles":
        kernel = quantize_kernel(kernel, None, wgmma_unsupported(x, bits)).chosen  # the device judged there
    if kernel == "wgmma":
        from .quantize_wgmma import quantize_mse_wgmma

        return quantize_mse_wgmma(x, rotation_matrix, _as_numpy(boundaries), bits, norms_dtype,
                                  programs_per_sm=programs_per_sm or 3, stages=num_stages or 2)
    nearest = nearest or "table"
    rows, lead_shape = as_rows(x)
    n_rows = rows.shape[0]
    row_bytes = packed_size(dim, bits)
    codes = torch.empty((n_rows, row_bytes), dtype=torch.uint8, device=x.device)
    norms = torch.empty((n_rows,), dtype=norms_dtype, device=x.device)
    if n_rows == 0:
        return codes.reshape(*lead_shape, row_bytes), norms.reshape(lead_shape)
    table, lut_scale, lut_offset = nearest_operands(boundaries, nearest if lookup else "none", x.device)
    groups = num_groups(dim, bits)
    # Rows wider than 128 take the K-loop path: a single 256-wide tile with its rotation slices needs more
    # shared memory than sm_90's 227 KB (benchmarks/NOTES.md, "Constants").
    block_k = pow2_at_least(dim) if dim <= 128 else 128
    block_g = min(pow2_at_least(groups), 64)
    groups_padded = triton.cdiv(groups, block_g) * block_g
    n_tiles = triton.cdiv(n_rows, block_n)
    if x.device.type == "cuda":
        n_sm = torch.cuda.get_device_properties(x.device).multi_processor_count
        grid = (min(n_tiles, n_sm * (programs_per_sm or 4)),)
    else:
        grid = (n_tiles,)
    _quantize_mse_kernel[grid](
        rows, stream_rotation(rotation_matrix, bits, groups_padded), table, codes, norms,
        n_rows, dim, row_bytes, groups, groups_padded, rows.stride(0), codes.stride(0),
        lut_scale, lut_offset,
        BITS=bits, BYTES_PER_GROUP=bytes_per_group, CODES_PER_GROUP=codes_per_group,
        BLOCK_N=block_n, BLOCK_K=block_k, BLOCK_G=block_g, LUT_MASK=table.numel() - 1,
        SINGLE_K=dim <= block_k, RESIDENT=dim <= block_k and codes_per_group == 2 and groups <= block_g,
        NEAREST=nearest if lookup else "none",
        num_warps=num_warps, num_stages=num_stages or 3,
    )
    return codes.reshape(*lead_shape, row_bytes), norms.reshape(lead_shape)


def quantize_mse_reference(
    x: torch.Tensor, rotation_matrix: torch.Tensor, boundaries: torch.Tensor | np.ndarray, bits: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Exact float64 reference: ``(codes, norms, y_unit)`` with codes packed as the library packs them.

    ``y_unit = Pi x / ||x||`` is returned so that tests can tell rounding ties from errors.
    """
    from turboquant.packing import pack_codes

    _check_inputs(x, rotation_matrix)
    xf = x.to(torch.float64)
    norms = torch.linalg.vector_norm(xf, dim=-1)
    unit = xf / torch.where(norms > 0, norms, 1.0)[..., None]
    y = unit @ rotation_matrix.to(torch.float64).T
    bnd = torch.as_tensor(_as_numpy(boundaries), device=x.device)
    idx = torch.bucketize(y, bnd)
    return pack_codes(idx.to(torch.uint8), bits), norms, y
