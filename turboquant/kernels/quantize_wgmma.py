"""TurboQuant_mse quantization (Algorithm 1, lines 5-7) on Hopper's warpgroup MMA (Gluon, sm_90): fp16 or bf16 rows
of 128 channels -> packed codes + norms, one pass.

A persistent program is one warpgroup (4 warps) and owns tiles of 64 rows. Per tile:

    n = ||x||,   y = (x / n) B   with  B = Pi^T, columns permuted by :func:`code_column_order`  (``wgmma``: the unit
                                     rows are the register operand, B sits in shared memory, loaded once per program),
    idx_j = #{k : y_j > t_k}         (the branch-free midpoint tree of ``quantize.py``: the Lloyd-Max midpoints are
                                      symmetric, so the sign of y and b - 1 compares of |y| against the 2^(b-1) - 1
                                      positive midpoints, held as scalars),

and the codes go to memory straight from the accumulator. Lane 4g + t of a warp holds accumulator columns
8j + 2t + u (j = 0..15, u = 0, 1) of its rows; B's column permutation puts rotated channel 32t + 2j + u there, so each
lane owns the contiguous channels 32t .. 32t + 31 of a row: b 32-bit words of the packed row (16 / 12 / 8 / 4 bytes
at b = 4 / 3 / 2 / 1), which it assembles with in-register shifts and sums and stores without an exchange. The rows
are loaded coalesced (16 bytes per lane) and the next tile's loads are issued before the current tile is computed.

The codes equal :func:`turboquant.kernels.quantize.quantize_mse_triton`'s (both multiply fp16 unit rows by the
fp16-rounded rotation with fp32 sums): the float64 reference differs only for coordinates within ~1e-3 |y| of a
midpoint. GPU only (Gluon has no interpreter); :func:`wgmma_quantize_unsupported` says what it does not read.
"""
from __future__ import annotations

import functools

import numpy as np
import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma

from ..packing import packed_size
from ._layout import as_rows

HEAD_DIM = 128
BLOCK_M = gl.constexpr(64)  # rows per tile: one m64 wgmma per warpgroup

ACC = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 128, 16]))
OPERAND_A = gl.constexpr(gl.DotOperandLayout(operand_index=0, parent=ACC.value, k_width=2))
TILE = gl.constexpr(gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0]))  # 64 x 128 16-bit loads: 16 bytes per lane
SHARED_B = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2))


@functools.cache
def code_column_order(device: torch.device | str = "cpu") -> torch.Tensor:
    """Rotated channel computed in accumulator column n: with n = 8j + 2t + u, channel 32t + 2j + u, so lane t of a
    quad holds the channels 32t .. 32t + 31 of its rows. Made once per ``device``, shared."""
    n = torch.arange(HEAD_DIM)
    return (32 * ((n >> 1) & 3) + 2 * (n >> 3) + (n & 1)).to(device)


def wgmma_quantize_unsupported(x: torch.Tensor, bits: int) -> str | None:
    """Why :func:`quantize_mse_wgmma` cannot quantize ``x`` at ``bits``, or None."""
    if x.dtype not in (torch.float16, torch.bfloat16):
        return f"the warpgroup-MMA quantize kernel reads float16 or bfloat16 rows, got {x.dtype}"
    if x.shape[-1] != HEAD_DIM:
        return f"the warpgroup-MMA quantize kernel reads rows of {HEAD_DIM} channels, not {x.shape[-1]}"
    if bits not in (1, 2, 3, 4):
        return f"the warpgroup-MMA quantize kernel writes 1-4-bit codes, not {bits}"
    if x.device.type != "cuda" or torch.cuda.get_device_capability(x.device)[0] != 9:
        return "the warpgroup-MMA quantize kernel runs on Hopper GPUs (sm_90) only"
    return None


@gluon.jit
def _tree_codes(y, m0, m1, m2, m3, m4, m5, m6, BITS: gl.constexpr):
    """idx = #{k : y > t_k} for a symmetric codebook, from its positive midpoints m0 < m1 < ... (scalars): the sign of
    y, then a binary search of |y| (b - 1 compares)."""
    HALF: gl.constexpr = 1 << (BITS - 1)
    a = gl.abs(y)
    if BITS == 1:
        j = gl.zeros_like(y).to(gl.int32)
    elif BITS == 2:
        j = (a > m0).to(gl.int32)
    elif BITS == 3:
        c1 = a > m1
        j = c1.to(gl.int32) * 2 + (a > gl.where(c1, m2, m0)).to(gl.int32)
    else:
        c2 = a > m3
        c1 = a > gl.where(c2, m5, m1)
        t0 = gl.where(c2, gl.where(c1, m6, m4), gl.where(c1, m2, m0))
        j = c2.to(gl.int32) * 4 + c1.to(gl.int32) * 2 + (a > t0).to(gl.int32)
    return gl.where(y > 0, HALF + j, (HALF - 1) - j)


# 1.0 where $1 > t, 0.0 where $1 <= t, given $2 = -t * 2^40: one saturating FMA (the FMA pipe, no compare or
# select). Exact for thresholds t >= 2^-10 (any fp32 value above t then exceeds it by >= 2^-33, so the product is
# >= 128); with $2 = 0 and the scale 2^126 instead, 1.0 exactly where $1 is a positive normal number.
_ABOVE = gl.constexpr("fma.rn.sat.f32 $0, $1, 0f53800000, $2;")
_POSITIVE = gl.constexpr("fma.rn.sat.f32 $0, $1, 0f7E800000, 0f00000000;")
_SCALE = gl.constexpr(1099511627776.0)  # 2^40


@gluon.jit
def _above(a, neg_scaled):
    return gl.inline_asm_elementwise(_ABOVE, "=r,r,r", [a, neg_scaled], dtype=gl.float32, is_pure=True, pack=1)


@gluon.jit
def _fma_levels(a, m0, m1, m2, m3, m4, m5, m6, BITS: gl.constexpr):
    """The outcomes (c2, c1, c0), 1.0 or 0.0, of the midpoint tree's levels for |y| = ``a`` (j = 4 c2 + 2 c1 + c0;
    the levels a width lacks are 0.0), in floating-point arithmetic for the FMA pipe instead of the integer one (the
    tree's compares and selects are what bound the kernel, ``benchmarks/NOTES.md`` session 17): each compare is a
    saturating FMA (:data:`_ABOVE`), the next level's threshold an FMA of the outcomes so far. The thresholds enter as
    -t * 2^40 (exact: a power-of-two scaling); their FMA combinations round once, which can move a threshold by an
    ulp (a tie)."""
    zero = gl.zeros_like(a)
    if BITS == 1:
        levels = (zero, zero, zero)
    elif BITS == 2:
        levels = (zero, zero, _above(a, m0 * -_SCALE))
    elif BITS == 3:
        c1 = _above(a, m1 * -_SCALE)
        levels = (zero, c1, _above(a, gl.fma(c1, (m0 - m2) * _SCALE, m0 * -_SCALE)))
    else:
        c2 = _above(a, m3 * -_SCALE)
        c1 = _above(a, gl.fma(c2, (m1 - m5) * _SCALE, m1 * -_SCALE))
        step = gl.fma(c2, (m4 + m2 - m6 - m0) * _SCALE, (m0 - m2) * _SCALE)  # threshold change when c1 = 1
        levels = (c2, c1, _above(a, gl.fma(c1, step, gl.fma(c2, (m0 - m4) * _SCALE, m0 * -_SCALE))))
    return levels


@gluon.jit
def _positive(y):
    return gl.inline_asm_elementwise(_POSITIVE, "=r,r", [y], dtype=gl.float32, is_pure=True, pack=1)


@gluon.jit
def _fma_codes(y, levels, BITS: gl.constexpr):
    """The codes of :func:`_tree_codes` from :func:`_fma_levels`: code = h - 1 - j + [y > 0] (2j + 1), read from the
    bits of code + 1.5 * 2^23."""
    HALF: gl.constexpr = 1 << (BITS - 1)
    if BITS == 4:
        j = gl.fma(levels[0], 4.0, gl.fma(levels[1], 2.0, levels[2]))
    elif BITS == 3:
        j = gl.fma(levels[1], 2.0, levels[2])
    else:
        j = levels[2]
    biased = gl.fma(_positive(y), gl.fma(j, 2.0, 1.0), (HALF - 1 + 12582912.0) - j)  # code + 1.5 * 2^23, exact
    return biased.to(gl.int32, bitcast=True) & ((1 << BITS) - 1)


@gluon.jit
def _fma_centroids(y, levels, g0, g1, g2, g3, BITS: gl.constexpr):
    """The centroid c[code] of each coordinate, from :func:`_fma_levels` and the symmetric codebook's positive half
    g0 < g1 < ... (c[h + j] = g_j, c[h - 1 - j] = -g_j): g_j as the multilinear form in the level outcomes, then the
    sign of y; 1-3 bits."""
    if BITS == 1:
        magnitude = gl.zeros_like(y) + g0
    elif BITS == 2:
        magnitude = gl.fma(levels[2], g1 - g0, gl.zeros_like(y) + g0)
    else:
        magnitude = gl.fma(levels[1], gl.fma(levels[2], g3 - g2 - g1 + g0, g2 - g0), gl.fma(levels[2], g1 - g0, g0))
    return gl.fma(_positive(y), 2.0 * magnitude, -magnitude)


@gluon.jit
def _slots(codes, BITS: gl.constexpr):
    """(64, 128) codes in :data:`ACC` -> (64, 4 lanes t, slots): slot k of lane t packs the codes of rotated channels
    32t + k W .. 32t + (k + 1) W - 1 (W = 8 for b = 3, else 32 / b), channel c at bits BITS * (c mod W)."""
    PAIRS: gl.constexpr = 4 if BITS == 3 else 16 // BITS  # accumulator column pairs (j) per slot
    SLOTS: gl.constexpr = 16 // PAIRS
    n = gl.arange(0, 128, layout=gl.SliceLayout(0, ACC))
    shift = BITS * (2 * ((n >> 3) % PAIRS) + (n & 1))
    x = gl.reshape(codes << shift[None, :], [64, SLOTS, PAIRS, 4, 2])  # n = 8 (PAIRS k + jj) + 2t + u
    return gl.permute(gl.sum(gl.sum(x, axis=4), axis=2), [0, 2, 1])


@gluon.jit
def _store_words(words, code_words_ptr, row0, n_rows, stride_words, first, step):
    """Store (64, n) int32 ``words`` of rows ``row0 + arange(64)`` at word columns ``first + step * arange(n)``."""
    layout: gl.constexpr = words.type.layout
    rows = row0 + gl.arange(0, 64, layout=gl.SliceLayout(1, layout))
    cols = first + step * gl.arange(0, words.shape[1], layout=gl.SliceLayout(0, layout))
    gl.store(code_words_ptr + rows.to(gl.int64)[:, None] * stride_words + cols[None, :],
             words.to(gl.int32, bitcast=True), mask=(rows < n_rows)[:, None])


@gluon.jit
def _store_codes(codes, code_words_ptr, row0, n_rows, stride_words, BITS: gl.constexpr):
    """Pack (64, 128) int32 codes held in :data:`ACC` (columns in :func:`code_column_order`) into the library's bit
    stream: lane t writes words BITS t .. BITS t + BITS - 1 of each of its rows."""
    slots = _slots(codes, BITS)  # (64, t, slot)
    if BITS == 3:  # four 24-bit groups g0..g3 (slots) -> words 3t, 3t + 1, 3t + 2
        even, odd = gl.split(gl.reshape(slots.to(gl.uint32, bitcast=True), [64, 4, 2, 2]))
        g0, g2 = gl.split(even)
        g1, g3 = gl.split(odd)
        _store_words(g0 | (g1 << 24), code_words_ptr, row0, n_rows, stride_words, 0, 3)
        _store_words((g1 >> 8) | (g2 << 16), code_words_ptr, row0, n_rows, stride_words, 1, 3)
        _store_words((g2 >> 16) | (g3 << 8), code_words_ptr, row0, n_rows, stride_words, 2, 3)
    else:  # slot k of lane t is word BITS t + k
        _store_words(gl.reshape(slots, [64, 4 * BITS]), code_words_ptr, row0, n_rows, stride_words, 0, 1)


@gluon.jit
def _shared_operand(b_ptr):
    """A (128, 128) fp16 row-major matrix in shared memory as a ``wgmma`` B operand (loaded once per program)."""
    cols = gl.arange(0, 128, layout=gl.SliceLayout(0, TILE))
    k_rows = gl.arange(0, 128, layout=gl.SliceLayout(1, TILE))
    tile = gl.load(b_ptr + k_rows[:, None] * 128 + cols[None, :])
    return gl.allocate_shared_memory(gl.float16, [128, 128], SHARED_B, tile)


@gluon.jit
def _load_rows(x_ptr, rows, cols, n_rows, stride_x):
    """(64, 128) rows of x in :data:`TILE` (zeros past ``n_rows``)."""
    return gl.load(x_ptr + rows.to(gl.int64)[:, None] * stride_x + cols[None, :], mask=(rows < n_rows)[:, None],
                   other=0.0)


@gluon.jit
def quantize_wgmma_kernel(x_ptr, b_ptr, mid_ptr, code_words_ptr, norms_ptr, n_rows, stride_x, stride_words,
                          sketch_ptr, magnitude_ptr, sign_words_ptr, residual_norms_ptr, stride_sign_words,
                          BITS: gl.constexpr, NEAREST: gl.constexpr, PROD: gl.constexpr, PREFETCH: gl.constexpr):
    """Persistent grid over tiles of 64 rows (module docstring). ``b_ptr``: (128, 128) fp16 B = Pi^T with columns in
    :func:`code_column_order`; ``mid_ptr``: the 2^(b-1) - 1 positive midpoints (float32, padded to 7 entries);
    ``code_words_ptr``: the packed rows as int32 words (4 b per row); ``NEAREST``: ``"tree"`` (:func:`_tree_codes`)
    or ``"fma"`` (:func:`_fma_codes`). ``PROD`` (TurboQuant_prod, Algorithm 2; b = ``BITS`` + 1, the codes from
    :func:`_fma_levels`): also the residual e = y - c[code] of the unit row in the rotated basis, its norm
    (``residual_norms_ptr``; ||r|| = ||e||) and the QJL sign bits [S r >= 0] = [M e >= 0], M = S Pi^T, from a second
    ``wgmma`` with e as the register operand and ``sketch_ptr`` = M^T, rows and columns in :func:`code_column_order`,
    stored from its accumulator as 1-bit codes (``sign_words_ptr``, 4 words per row); ``magnitude_ptr``: the
    codebook's positive centroids g0 < g1 < ... (float32, padded to 4 entries). The pointers of the unused stage are
    never read. ``PREFETCH``: load the next tile's rows into registers before computing this one (32 more registers
    per thread) or not (more resident programs within the register file)."""
    m0, m1, m2, m3 = gl.load(mid_ptr), gl.load(mid_ptr + 1), gl.load(mid_ptr + 2), gl.load(mid_ptr + 3)
    m4, m5, m6 = gl.load(mid_ptr + 4), gl.load(mid_ptr + 5), gl.load(mid_ptr + 6)
    b = _shared_operand(b_ptr)
    if PROD:
        g0, g1 = gl.load(magnitude_ptr), gl.load(magnitude_ptr + 1)
        g2, g3 = gl.load(magnitude_ptr + 2), gl.load(magnitude_ptr + 3)
        sketch = _shared_operand(sketch_ptr)
    fence_async_shared()
    cols = gl.arange(0, 128, layout=gl.SliceLayout(0, TILE))
    local = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, TILE))
    pid, n_programs = gl.program_id(0), gl.num_programs(0)
    if PREFETCH:
        x = _load_rows(x_ptr, pid * BLOCK_M + local, cols, n_rows, stride_x)
    for tile in range(pid, gl.cdiv(n_rows, BLOCK_M), n_programs):
        rows = tile * BLOCK_M + local
        if PREFETCH:  # the next tile's loads in flight while this one is computed
            x_next = _load_rows(x_ptr, rows + n_programs * BLOCK_M, cols, n_rows, stride_x)
        else:
            x = _load_rows(x_ptr, rows, cols, n_rows, stride_x)
        xf = x.to(gl.float32)
        norm = gl.sqrt(gl.sum(xf * xf, axis=1))
        gl.store(norms_ptr + rows, norm.to(norms_ptr.dtype.element_ty), mask=rows < n_rows)
        inv = gl.where(norm > 0, 1.0 / gl.maximum(norm, 1e-30), 0.0)
        unit = gl.convert_layout((xf * inv[:, None]).to(gl.float16), OPERAND_A)
        y = warpgroup_mma(unit, b, gl.zeros([BLOCK_M, 128], gl.float32, ACC), use_acc=False)
        if PROD:
            levels = _fma_levels(gl.abs(y), m0, m1, m2, m3, m4, m5, m6, BITS)
            codes = _fma_codes(y, levels, BITS)
            residual = y - _fma_centroids(y, levels, g0, g1, g2, g3, BITS)
            residual_rows = tile * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, ACC))
            gl.store(residual_norms_ptr + residual_rows,
                     gl.sqrt(gl.sum(residual * residual, axis=1)).to(residual_norms_ptr.dtype.element_ty),
                     mask=residual_rows < n_rows)
            z = warpgroup_mma(gl.convert_layout(residual.to(gl.float16), OPERAND_A), sketch,
                              gl.zeros([BLOCK_M, 128], gl.float32, ACC), use_acc=False)
            _store_codes((z >= 0).to(gl.int32), sign_words_ptr, tile * BLOCK_M, n_rows, stride_sign_words, 1)
        elif NEAREST == "fma":
            codes = _fma_codes(y, _fma_levels(gl.abs(y), m0, m1, m2, m3, m4, m5, m6, BITS), BITS)
        else:
            codes = _tree_codes(y, m0, m1, m2, m3, m4, m5, m6, BITS)
        _store_codes(codes, code_words_ptr, tile * BLOCK_M, n_rows, stride_words, BITS)
        if PREFETCH:
            x = x_next


@functools.lru_cache(maxsize=64)
def _positive_midpoints(midpoints: bytes, device: str) -> torch.Tensor:
    """The 2^(b-1) - 1 positive midpoints of a symmetric codebook, float32 padded to 7 entries, on ``device`` (built
    once per codebook and device: the launch then copies nothing from the host, as a CUDA-graph capture needs)."""
    bnd = np.frombuffer(midpoints, dtype=np.float64)
    if not np.allclose(bnd, -bnd[::-1], rtol=0, atol=1e-7) or np.any(np.diff(bnd) <= 0):
        raise ValueError("the warpgroup-MMA quantize kernel needs sorted symmetric midpoints (a Lloyd-Max codebook)")
    padded = np.zeros(7, dtype=np.float32)
    positive = bnd[bnd.size // 2 + 1:]
    padded[:positive.size] = positive
    return torch.tensor(padded, device=device)


def default_code_step(bits: int) -> str:
    """The code step of :func:`quantize_mse_wgmma` unless one is asked for: the saturating-FMA chain
    (:func:`_fma_codes`) at 4 bits, where the midpoint tree's selects bind the ALU pipe, the tree at 1-3 bits, where
    it has at most three levels (the H200 timings behind this: ``benchmarks/NOTES.md``, session 18)."""
    return "fma" if bits == 4 else "tree"


def quantize_mse_wgmma(x: torch.Tensor, rotation_matrix: torch.Tensor, boundaries: np.ndarray, bits: int,
                       norms_dtype: torch.dtype = torch.float32, nearest: str | None = None, programs_per_sm: int = 3,
                       prefetch: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes and norms of ``x`` (..., 128) float16 or bfloat16 as
    :func:`~turboquant.kernels.quantize.quantize_mse_triton` returns them (inputs checked there and by
    :func:`wgmma_quantize_unsupported`), computed by :func:`quantize_wgmma_kernel`; ``boundaries`` the codebook's
    midpoints as float64; ``nearest``: ``"tree"`` or ``"fma"`` (the code step, :func:`quantize_wgmma_kernel`), None
    for :func:`default_code_step`; ``programs_per_sm``: resident programs per SM (the register budget of each,
    ``maxnreg``, is set so that they fit); ``prefetch``: the kernel's ``PREFETCH``."""
    nearest = default_code_step(bits) if nearest is None else nearest
    if nearest not in ("tree", "fma"):
        raise ValueError(f"the warpgroup-MMA quantize kernel's nearest step is 'tree' or 'fma', got {nearest!r}")
    rows, lead_shape = as_rows(x)
    codes = torch.empty((rows.shape[0], packed_size(HEAD_DIM, bits)), dtype=torch.uint8, device=x.device)
    norms = torch.empty((rows.shape[0],), dtype=norms_dtype, device=x.device)
    _launch(rows, rotation_matrix, boundaries, bits, codes, norms, None, nearest, programs_per_sm, prefetch)
    return codes.reshape(*lead_shape, codes.shape[-1]), norms.reshape(lead_shape)


def quantize_prod_wgmma(x: torch.Tensor, rotation_matrix: torch.Tensor, boundaries: np.ndarray,
                        centroids: torch.Tensor, mse_bits: int, qjl_matrix: torch.Tensor,
                        norms_dtype: torch.dtype = torch.float32, programs_per_sm: int = 2,
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """TurboQuant_prod (Algorithm 2) of ``x`` (..., 128) float16 or bfloat16 as
    :func:`~turboquant.kernels.quantize_prod.quantize_prod_triton` returns it (codes, signs, norms, residual norms;
    inputs checked there and by :func:`wgmma_quantize_unsupported`), by :func:`quantize_wgmma_kernel` with ``PROD``:
    ``mse_bits`` 1-3, a symmetric codebook."""
    rows, lead_shape = as_rows(x)
    n_rows = rows.shape[0]
    codes = torch.empty((n_rows, packed_size(HEAD_DIM, mse_bits)), dtype=torch.uint8, device=x.device)
    signs = torch.empty((n_rows, packed_size(HEAD_DIM, 1)), dtype=torch.uint8, device=x.device)
    norms = torch.empty((n_rows,), dtype=norms_dtype, device=x.device)
    residual_norms = torch.empty((n_rows,), dtype=norms_dtype, device=x.device)
    prod = (_sketch_operand(rotation_matrix, qjl_matrix), _positive_magnitudes(centroids), signs, residual_norms)
    _launch(rows, rotation_matrix, boundaries, mse_bits, codes, norms, prod, "fma", programs_per_sm, True)
    return (codes.reshape(*lead_shape, codes.shape[-1]), signs.reshape(*lead_shape, signs.shape[-1]),
            norms.reshape(lead_shape), residual_norms.reshape(lead_shape))


def _launch(rows: torch.Tensor, rotation_matrix: torch.Tensor, boundaries: np.ndarray, bits: int,
            codes: torch.Tensor, norms: torch.Tensor, prod: tuple | None, nearest: str, programs_per_sm: int,
            prefetch: bool) -> None:
    """One persistent launch of :func:`quantize_wgmma_kernel` over ``rows`` (``prod``: the sketch operand, the
    positive centroids, the sign and residual-norm outputs), ``programs_per_sm`` programs of one warpgroup resident
    per SM within its 64K registers."""
    n_rows = rows.shape[0]
    if not n_rows:
        return
    mids = _positive_midpoints(np.asarray(boundaries, dtype=np.float64).tobytes(), str(rows.device))
    sketch, magnitudes, signs, residual_norms = prod if prod is not None else (rows, mids, codes, norms)
    n_sm = torch.cuda.get_device_properties(rows.device).multi_processor_count if rows.is_cuda else 4
    grid = (min(triton.cdiv(n_rows, BLOCK_M.value), programs_per_sm * n_sm),)
    quantize_wgmma_kernel[grid](rows, _code_operand(rotation_matrix), mids, codes.view(torch.int32), norms, n_rows,
                                rows.stride(0), codes.shape[1] // 4, sketch, magnitudes, signs.view(torch.int32),
                                residual_norms, signs.shape[1] // 4, BITS=bits, NEAREST=nearest,
                                PROD=prod is not None, PREFETCH=prefetch, num_warps=4,
                                maxnreg=min(255, 65536 // (128 * programs_per_sm) // 8 * 8))


def _code_operand(rotation_matrix: torch.Tensor) -> torch.Tensor:
    """B = Pi^T (128 x 128 fp16) with columns in :func:`code_column_order`."""
    order = code_column_order(rotation_matrix.device)
    return rotation_matrix.T[:, order].to(torch.float16).contiguous()


def _sketch_operand(rotation_matrix: torch.Tensor, qjl_matrix: torch.Tensor) -> torch.Tensor:
    """The second ``wgmma``'s B: (S Pi^T)^T (128 x 128 fp16), rows (the residual's rotated channels, as the first
    product's accumulator holds them) and columns (the sign channels) in :func:`code_column_order`."""
    order = code_column_order(rotation_matrix.device)
    sketch = qjl_matrix.to(torch.float64) @ rotation_matrix.to(torch.float64).T
    return sketch[order][:, order].T.to(torch.float16).contiguous()


def _positive_magnitudes(centroids: torch.Tensor) -> torch.Tensor:
    """The positive half g0 < g1 < ... of the symmetric codebook (2, 4 or 8 centroids) whose midpoints
    :func:`_positive_midpoints` checked, float32 padded to 4 entries, made on its device (no host copy)."""
    values = centroids.detach().to(torch.float32).flatten()
    if values.numel() not in (2, 4, 8):
        raise ValueError(f"the warpgroup-MMA prod kernel reads codebooks of 2, 4 or 8 centroids, got {values.numel()}")
    return torch.nn.functional.pad(values[values.numel() // 2:], (0, 4 - values.numel() // 2))
