"""TurboQuant_mse quantization (Algorithm 1, lines 5-7) on Hopper's warpgroup MMA (Gluon, sm_90): fp16 or bf16 rows
of 128 channels -> packed codes + norms, one pass.

A persistent program is one warpgroup (4 warps) and owns tiles of 64 rows. Per tile:

    n = ||x||,   y = (x B) / n   with  B = Pi^T, columns permuted by :func:`code_column_order`  (``wgmma`` from
                                     shared memory: the rows as TMA staged them and B, loaded once per program; the
                                     product is linear, so 1 / n scales the accumulator),
    idx_j = #{k : y_j > t_k}         (the Lloyd-Max midpoints are symmetric: the sign of y and b - 1 compares of |y|
                                      against the 2^(b-1) - 1 positive midpoints, a branch-free binary search),

and the codes go to memory straight from the accumulator. Lane 4g + t of a warp holds accumulator columns
8j + 2t + u (j = 0..15, u = 0, 1) of its rows. The code step runs on the two coordinates of a column pair at once,
in fp16 (:func:`_f16x2_codes`: the pair converted to one register, the search on both halves per instruction), and
B's column permutation puts in lane t the rotated channels 32t .. 32t + 31, a pair's two codes 16 bits apart in
one packed word, so a lane assembles b 32-bit words of the packed row (16 / 12 / 8 / 4 bytes at b = 4 / 3 / 2 / 1)
with a shift-add per pair and stores them without an exchange.

TMA stages each program's tiles a few ahead in shared memory (:func:`quantize_wgmma_kernel`'s ``STAGES``). fp16
rows pass through registers only for their norm, read from the staged tile in the accumulator's layout, and enter
the product unrounded; bf16 rows are read into registers as the product's operand, scaled to unit rows and rounded to
fp16 there. B is fp16, the sums fp32. The code step compares y and the midpoints rounded to fp16, so the float64
reference's codes differ only for coordinates within ~1e-3 |y| of a midpoint. GPU only (Gluon has no interpreter);
:func:`wgmma_quantize_unsupported` says what it does not read. TurboQuant_prod (Algorithm 2) runs in the same kernel
(:func:`quantize_prod_wgmma`).
"""
from __future__ import annotations

import functools

import numpy as np
import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from ..packing import packed_size
from ._layout import as_rows, blocks_fitting_shared_memory

# The TMA load into shared memory: async_copy_global_to_shared up to Triton 3.6 (the device image), async_load after
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared

HEAD_DIM = 128
BLOCK_M = gl.constexpr(64)  # rows per tile: one m64 wgmma per warpgroup

ACC = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 128, 16]))
OPERAND_A = gl.constexpr(gl.DotOperandLayout(operand_index=0, parent=ACC.value, k_width=2))
TILE = gl.constexpr(gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0]))  # B's 16-bit loads: 16 bytes per lane
SHARED_B = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2))
SHARED_ROWS = SHARED_B  # a (64, 128) tile of 16-bit rows staged by TMA: wgmma's shared-memory A operand, K-major
ROW_TILE_BYTES = gl.constexpr(64 * HEAD_DIM * 2)  # one such tile
OPERAND_BYTES = HEAD_DIM * HEAD_DIM * 2  # one (128, 128) 16-bit B operand in shared memory


@gluon.constexpr_function
def pairs_per_word(bits: int) -> int:
    """Accumulator column pairs (u = 0, 1) whose codes share a packed 32-bit word: 16 / b; at 3 bits the 4 pairs of a
    24-bit group of 8 codes."""
    return 4 if bits == 3 else 16 // bits


@functools.cache
def code_column_order(bits: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Rotated channel computed in accumulator column n = 8j + 2t + u (lane t of a quad holds columns 8j + 2t + u of
    its rows, j = 0..15) for ``bits``-bit codes: with P = :func:`pairs_per_word`, channel
    32t + 2P (j div P) + (j mod P) + P u, so lane t owns channels 32t .. 32t + 31 and the pair (j, u = 0 / 1), one
    register with u = 1 in the high half, holds codes p = j mod P and p + P of word (3 bits: group) j div P, at bits
    b p and 16 + b p = b (p + P), where the word puts them (:func:`_store_pairs`). Made once per width and device,
    shared."""
    n = torch.arange(HEAD_DIM)
    j, t, u = n >> 3, (n >> 1) & 3, n & 1
    pairs = pairs_per_word(bits)
    return (32 * t + 2 * pairs * (j // pairs) + j % pairs + pairs * u).to(device)


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


@gluon.constexpr_function
def _f16x2_code_lines(bits: int, residuals: bool = False) -> list[str]:
    """PTX of :func:`_f16x2_codes` for ``bits``. Operands: outputs $0, $1 (int32: the pair's codes in the low bits of
    each half, twice), with ``residuals`` also $2, $3 (float32: y_u - c[code_u]); then the inputs y_0, y_1 (float32),
    the positive midpoints m_k as fp16 pairs (seven, from $(i + 2)), with ``residuals`` the positive centroids g_k
    likewise (four, from $(i + 16)), i the first input. ``set.gt.u32.f16x2`` gives a 0xFFFF / 0 mask per half (ptxas
    folds the |.| into it), ``lop3`` 0xE4 selects by a mask, 0x6A is (a & b) ^ c, 0xF2 is a | (~b & c). The tree's
    levels give j; code = j ^ (y > 0 ? h : h - 1) with h = 2^(b-1) (j < h); c[code] = +-g_j, negative unless y > 0."""
    half, i = 1 << (bits - 1), (4 if residuals else 2)
    m = [f"${i + 2 + 2 * k}" for k in range(7)]
    g = [f"${i + 16 + 2 * k}" for k in range(4)]
    pair = lambda v: f"0x{v:04X}{v:04X}"  # noqa: E731
    lines = [f"cvt.rn.f16x2.f32 h, ${i + 1}, ${i};", "abs.f16x2 a, h;", "mov.b32 z, 0;", "set.gt.u32.f16x2 p, h, z;",
             f"lop3.b32 t, p, {pair(2 * half - 1)}, {pair(half - 1)}, 0x6A;"]  # (y > 0 ? 2h - 1 : 0) ^ (h - 1)
    if bits == 4:
        lines += [f"set.gt.u32.f16x2 c2, a, {m[3]};",
                  f"lop3.b32 t, c2, {pair(4)}, t, 0x6A;",
                  f"lop3.b32 u, {m[5]}, {m[1]}, c2, 0xE4;",  # c2 ? m5 : m1
                  f"lop3.b32 v, {m[4]}, {m[0]}, c2, 0xE4;",
                  f"lop3.b32 w, {m[6]}, {m[2]}, c2, 0xE4;",
                  "set.gt.u32.f16x2 c1, a, u;",
                  f"lop3.b32 t, c1, {pair(2)}, t, 0x6A;",
                  "lop3.b32 u, w, v, c1, 0xE4;"]  # c1 ? (c2 ? m6 : m2) : (c2 ? m4 : m0)
    elif bits == 3:
        lines += [f"set.gt.u32.f16x2 c1, a, {m[1]};",
                  f"lop3.b32 t, c1, {pair(2)}, t, 0x6A;",
                  f"lop3.b32 u, {m[2]}, {m[0]}, c1, 0xE4;"]  # c1 ? m2 : m0
    elif bits == 2:
        lines += [f"mov.b32 u, {m[0]};"]
    if bits > 1:
        lines += ["set.gt.u32.f16x2 c0, a, u;", f"lop3.b32 t, c0, {pair(1)}, t, 0x6A;"]
    lines += ["mov.b32 $0, t;", "mov.b32 $1, t;"]
    if residuals:
        if bits == 3:
            lines += [f"lop3.b32 u, {g[3]}, {g[2]}, c0, 0xE4;", f"lop3.b32 v, {g[1]}, {g[0]}, c0, 0xE4;",
                      "lop3.b32 u, u, v, c1, 0xE4;"]
        elif bits == 2:
            lines += [f"lop3.b32 u, {g[1]}, {g[0]}, c0, 0xE4;"]
        else:
            lines += [f"mov.b32 u, {g[0]};"]
        lines += ["lop3.b32 u, u, p, 0x80008000, 0xF2;", "mov.b32 {lo, hi}, u;", "cvt.f32.f16 f, lo;",
                  f"sub.f32 $2, ${i}, f;", "cvt.f32.f16 f, hi;", f"sub.f32 $3, ${i + 1}, f;"]
    return lines


@gluon.constexpr_function
def _f16x2_code_asm(bits: int, residuals: bool = False) -> str:
    """The PTX block of :func:`_f16x2_code_lines` (a compile-time function: the kernel picks it by ``BITS``)."""
    return ("{\n.reg .b32 h, a, z, p, t, c2, c1, c0, u, v, w;\n.reg .b16 lo, hi;\n.reg .f32 f;\n"
            + "\n".join(_f16x2_code_lines(bits, residuals)) + "\n}")


F16X2_CODES_CONSTRAINTS = gl.constexpr(",".join(["=r"] * 2 + ["r"] * 16))
F16X2_RESIDUALS_CONSTRAINTS = gl.constexpr(",".join(["=r"] * 4 + ["r"] * 24))
# [z >= 0] for a pair of float32 z (inputs $2, $3) as a register of two 1-bit codes (u = 1 in the high half), in $0
# and $1: the sign bits, bytes 3 of z_0 and z_1 moved to bytes 0 and 2 by one prmt, then shifted to bits 0 and 16 and
# inverted (exact for every z but -0.0, which the accumulator does not produce from a nonzero residual).
PAIR_SIGNS = gl.constexpr("{\n.reg .b32 t;\nprmt.b32 t, $2, $3, 0x7733;\nshr.u32 t, t, 7;\nnot.b32 t, t;\n"
                           "and.b32 $0, t, 0x00010001;\nmov.b32 $1, $0;\n}")


@gluon.jit
def _f16x2_codes(y, w0, w1, w2, w3, w4, w5, w6, BITS: gl.constexpr):
    """idx = #{k : y > t_k} for pairs of coordinates in one register: the midpoint tree on fp16 pairs, two
    coordinates per instruction, with masks instead of outcomes (:func:`_f16x2_code_lines`). ``w0`` .. ``w6``: the
    positive midpoints as int32 words of two equal fp16 halves (scalars). Returns (64, 128) int32 whose columns
    8j + 2t and 8j + 2t + 1 both hold the pair's register (:func:`_store_pairs`). The fp16 rounding of y and
    of the midpoints moves a coordinate's code only within 2^-10 |y| + 2^-24 of a midpoint (a tie)."""
    return gl.inline_asm_elementwise(_f16x2_code_asm(BITS, False), F16X2_CODES_CONSTRAINTS,
                                     [y, w0, w1, w2, w3, w4, w5, w6], dtype=gl.int32, is_pure=True, pack=2)


@gluon.jit
def _f16x2_codes_residuals(y, w0, w1, w2, w3, w4, w5, w6, v0, v1, v2, v3, BITS: gl.constexpr):
    """:func:`_f16x2_codes` and the residuals y - c[code] (float32, (64, 128) in :data:`ACC`), the centroid chosen
    by the same masks from ``v0`` .. ``v3``, the positive centroids g_j as words of two equal fp16 halves (so c[code]
    is rounded to fp16: within 2^-11 |c| of the codebook's); 1-3 bits."""
    return gl.inline_asm_elementwise(_f16x2_code_asm(BITS, True), F16X2_RESIDUALS_CONSTRAINTS,
                                     [y, w0, w1, w2, w3, w4, w5, w6, v0, v1, v2, v3], dtype=(gl.int32, gl.float32),
                                     is_pure=True, pack=2)


@gluon.jit
def _pair_signs(z):
    """The QJL sign bits [z >= 0] of (64, 128) float32 ``z`` in :data:`ACC` as pair registers of 1-bit codes, in the
    layout :func:`_f16x2_codes` returns (:data:`PAIR_SIGNS`), so they are stored as the codes are."""
    return gl.inline_asm_elementwise(PAIR_SIGNS, "=r,=r,r,r", [z], dtype=gl.int32, is_pure=True, pack=2)


@gluon.jit
def _words(pairs, BITS: gl.constexpr):
    """(64, 4, 16) pair registers (:func:`code_column_order`) -> (64, 4, 16 / P) the sums of pair p << BITS p over
    the P = :func:`pairs_per_word` pairs of each word (3 bits: 24-bit group), a shift-add per pair (``LEA``), as a
    tree over p: the low code of pair p lands at bits BITS p, the high one at 16 + BITS p."""
    P: gl.constexpr = pairs_per_word(BITS)
    LEVELS: gl.constexpr = 2 if P == 4 else (3 if P == 8 else 4)  # log2 P
    x = gl.reshape(pairs, [64, 4, 16 // P, P])
    for level in gl.static_range(LEVELS):
        even, odd = gl.split(gl.reshape(x, [64, 4, 16 // P, P >> (level + 1), 2]))
        x = even + (odd << (BITS << level))
    return gl.reshape(x, [64, 4, 16 // P])


@gluon.jit
def _store_words(words, code_words_ptr, row0, n_rows, stride_words, first, step):
    """Store (64, n) int32 ``words`` of rows ``row0 + arange(64)`` at word columns ``first + step * arange(n)``."""
    layout: gl.constexpr = words.type.layout
    rows = row0 + gl.arange(0, 64, layout=gl.SliceLayout(1, layout))
    cols = first + step * gl.arange(0, words.shape[1], layout=gl.SliceLayout(0, layout))
    gl.store(code_words_ptr + rows.to(gl.int64)[:, None] * stride_words + cols[None, :],
             words.to(gl.int32, bitcast=True), mask=(rows < n_rows)[:, None])


@gluon.jit
def _store_pairs(pairs, code_words_ptr, row0, n_rows, stride_words, BITS: gl.constexpr):
    """Pack (64, 128) int32 pair registers in :data:`ACC` (columns 8j + 2t and 8j + 2t + 1 both hold pair j of lane t,
    as :func:`_f16x2_codes` and :func:`_pair_signs` return them; channels in :func:`code_column_order`) into the
    library's bit stream: the words of lane t (:func:`_words`) are words BITS t .. BITS t + BITS - 1 of each of its
    rows; at 3 bits they are 24-bit groups g0..g3 (their high codes moved from bits 16-27 down to 12-23), cut into
    words 3t, 3t + 1, 3t + 2."""
    lo, _ = gl.split(gl.reshape(pairs, [64, 16, 4, 2]))  # one register per pair: (64, 16 pairs j, 4 lanes t)
    words = _words(gl.permute(lo, [0, 2, 1]), BITS)
    if BITS == 3:
        groups = ((words & 0xFFF) | ((words >> 4) & 0xFFF000)).to(gl.uint32, bitcast=True)
        even, odd = gl.split(gl.reshape(groups, [64, 4, 2, 2]))
        g0, g2 = gl.split(even)
        g1, g3 = gl.split(odd)
        _store_words(g0 | (g1 << 24), code_words_ptr, row0, n_rows, stride_words, 0, 3)
        _store_words((g1 >> 8) | (g2 << 16), code_words_ptr, row0, n_rows, stride_words, 1, 3)
        _store_words((g2 >> 16) | (g3 << 8), code_words_ptr, row0, n_rows, stride_words, 2, 3)
    else:
        _store_words(gl.reshape(words, [64, 4 * BITS]), code_words_ptr, row0, n_rows, stride_words, 0, 1)


@gluon.jit
def _shared_operand(b_ptr):
    """A (128, 128) 16-bit row-major matrix (``b_ptr``'s dtype) in shared memory as a ``wgmma`` B operand (loaded
    once per program)."""
    cols = gl.arange(0, 128, layout=gl.SliceLayout(0, TILE))
    k_rows = gl.arange(0, 128, layout=gl.SliceLayout(1, TILE))
    tile = gl.load(b_ptr + k_rows[:, None] * 128 + cols[None, :])
    return gl.allocate_shared_memory(b_ptr.dtype.element_ty, [128, 128], SHARED_B, tile)


@gluon.jit
def _stage_rows(x_desc, x_smem, ready, slot, tile, live):
    """Issue the TMA copy of tile ``tile``'s 64 rows into buffer ``slot`` of ``x_smem``, completing on
    ``ready[slot]`` (rows past the descriptor's shape arrive as zeros); nothing where ``live`` is false."""
    mbarrier.expect(ready.index(slot), ROW_TILE_BYTES, pred=live)
    _tma_load(x_desc, [tile * BLOCK_M, 0], ready.index(slot), x_smem.index(slot), pred=live)


@gluon.jit
def _store_norms(norm, rows, norms_ptr, n_rows):
    """Store the rows' norms (``rows`` their indices, in ``norm``'s layout) and return 1 / n (0 for a zero row)."""
    gl.store(norms_ptr + rows, norm.to(norms_ptr.dtype.element_ty), mask=rows < n_rows)
    return gl.where(norm > 0, 1.0 / gl.maximum(norm, 1e-30), 0.0)


@gluon.jit
def _staged_product(x_smem, ready, slot, phase, b, tile, norms_ptr, n_rows):
    """Once buffer ``slot`` holds its fp16 rows (``ready[slot]`` at ``phase``): y = (x B) / n of the staged (64, 128)
    tile in :data:`ACC`, its norms stored. x B by ``wgmma`` from shared memory (the rows unscaled:
    y = (x / n) B = (x B) / n); the sum of squares from the same buffer, read in the accumulator's layout while the
    product runs, so each norm lands on the lanes that hold its row."""
    mbarrier.wait(ready.index(slot), phase)
    x = x_smem.index(slot)
    y = warpgroup_mma(x, b, gl.zeros([BLOCK_M, 128], gl.float32, ACC), use_acc=False, is_async=True)
    xf = x.load(ACC).to(gl.float32)
    rows = tile * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, ACC))
    inv = _store_norms(gl.sqrt(gl.sum(xf * xf, axis=1)), rows, norms_ptr, n_rows)
    y = warpgroup_mma_wait(0, deps=[y])
    return y * inv[:, None]


@gluon.jit
def _converted_product(x_smem, ready, slot, phase, b, tile, norms_ptr, n_rows):
    """Once buffer ``slot`` holds its bf16 rows: y = (x / n) B of the staged tile in :data:`ACC`, its norms stored.
    bf16 is not an fp16 operand and its range is wider than fp16's, so the tile is read into registers as the
    product's register operand (:data:`OPERAND_A`), scaled to unit rows there and rounded to fp16 (unit rows fit)."""
    mbarrier.wait(ready.index(slot), phase)
    x = x_smem.index(slot).load(OPERAND_A).to(gl.float32)
    rows = tile * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, OPERAND_A))
    inv = _store_norms(gl.sqrt(gl.sum(x * x, axis=1)), rows, norms_ptr, n_rows)
    return warpgroup_mma((x * inv[:, None]).to(gl.float16), b, gl.zeros([BLOCK_M, 128], gl.float32, ACC),
                         use_acc=False)


@gluon.jit
def _code_tile(y, tile, w0, w1, w2, w3, w4, w5, w6, v0, v1, v2, v3, sketch, code_words_ptr, n_rows, stride_words,
               sign_words_ptr, residual_norms_ptr, stride_sign_words, BITS: gl.constexpr, PROD: gl.constexpr):
    """Codes of the unit rows' rotations ``y`` ((64, 128) in :data:`ACC`) of tile ``tile``, stored; with ``PROD`` the
    residual norms and the QJL signs too (:func:`quantize_wgmma_kernel`)."""
    if PROD:
        codes, residual = _f16x2_codes_residuals(y, w0, w1, w2, w3, w4, w5, w6, v0, v1, v2, v3, BITS)
        residual_rows = tile * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, ACC))
        gl.store(residual_norms_ptr + residual_rows,
                 gl.sqrt(gl.sum(residual * residual, axis=1)).to(residual_norms_ptr.dtype.element_ty),
                 mask=residual_rows < n_rows)
        z = warpgroup_mma(gl.convert_layout(residual.to(gl.float16), OPERAND_A), sketch,
                          gl.zeros([BLOCK_M, 128], gl.float32, ACC), use_acc=False)
        _store_pairs(_pair_signs(z), sign_words_ptr, tile * BLOCK_M, n_rows, stride_sign_words, 1)
    else:
        codes = _f16x2_codes(y, w0, w1, w2, w3, w4, w5, w6, BITS)
    _store_pairs(codes, code_words_ptr, tile * BLOCK_M, n_rows, stride_words, BITS)


@gluon.jit
def quantize_wgmma_kernel(x_desc, b_ptr, mid_ptr, code_words_ptr, norms_ptr, n_rows, stride_words,
                          sketch_ptr, magnitude_ptr, sign_words_ptr, residual_norms_ptr, stride_sign_words,
                          BITS: gl.constexpr, PROD: gl.constexpr, STAGES: gl.constexpr):
    """Persistent grid over tiles of 64 rows (module docstring). ``x_desc``: the rows' TMA descriptor
    (:data:`SHARED_ROWS`); ``STAGES`` (>= 2) tiles are in flight in shared memory, each the product's shared-memory
    operand as it stands (:func:`_staged_product`: y = (x B) / n, the scale on the accumulator; bf16 rows through
    registers, :func:`_converted_product`). ``b_ptr``: (128, 128) fp16 B = Pi^T with columns in
    :func:`code_column_order`; ``mid_ptr``: the positive midpoints as fp16 pairs (:func:`_positive_midpoints`);
    ``code_words_ptr``: the packed rows as int32 words (4 b per row). ``PROD``
    (TurboQuant_prod, Algorithm 2; b = ``BITS`` + 1): the codes and the residual e = y - c[code] of the unit row in the
    rotated basis from :func:`_f16x2_codes_residuals` (``magnitude_ptr``: the codebook's positive centroids as fp16
    pairs, :func:`_positive_magnitudes`), its norm (``residual_norms_ptr``; ||r|| = ||e||) and the QJL sign bits
    [S r >= 0] = [M e >= 0], M = S Pi^T, from a second ``wgmma`` with e as the register operand and ``sketch_ptr`` =
    M^T (:func:`_sketch_operand`), stored from its accumulator as 1-bit codes (:func:`_pair_signs`;
    ``sign_words_ptr``, 4 words per row). The pointers of the unused stage are never read."""
    w0, w1, w2, w3 = gl.load(mid_ptr), gl.load(mid_ptr + 1), gl.load(mid_ptr + 2), gl.load(mid_ptr + 3)
    w4, w5, w6 = gl.load(mid_ptr + 4), gl.load(mid_ptr + 5), gl.load(mid_ptr + 6)
    b = _shared_operand(b_ptr)
    CONVERT: gl.constexpr = x_desc.dtype == gl.bfloat16
    if PROD:
        v0, v1 = gl.load(magnitude_ptr), gl.load(magnitude_ptr + 1)
        v2, v3 = gl.load(magnitude_ptr + 2), gl.load(magnitude_ptr + 3)
        sketch = _shared_operand(sketch_ptr)
    else:
        v0, v1, v2, v3, sketch = w0, w1, w2, w3, b
    pid, n_programs = gl.program_id(0), gl.num_programs(0)
    x_smem = gl.allocate_shared_memory(x_desc.dtype, [STAGES, BLOCK_M, 128], SHARED_ROWS)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for slot in gl.static_range(STAGES):
        mbarrier.init(ready.index(slot), count=1)
    fence_async_shared()
    mine = gl.cdiv(gl.cdiv(n_rows, BLOCK_M) - pid, n_programs)  # this program's tiles: pid + i * n_programs, i < mine
    for i in gl.static_range(STAGES - 1):
        _stage_rows(x_desc, x_smem, ready, i, pid + i * n_programs, i < mine)
    for i in range(mine):
        ahead = i + STAGES - 1  # refills the buffer the previous tile was read from
        _stage_rows(x_desc, x_smem, ready, ahead % STAGES, pid + ahead * n_programs, ahead < mine)
        tile = pid + i * n_programs
        if CONVERT:
            y = _converted_product(x_smem, ready, i % STAGES, (i // STAGES) & 1, b, tile, norms_ptr, n_rows)
        else:
            y = _staged_product(x_smem, ready, i % STAGES, (i // STAGES) & 1, b, tile, norms_ptr, n_rows)
        _code_tile(y, tile, w0, w1, w2, w3, w4, w5, w6, v0, v1, v2, v3, sketch, code_words_ptr, n_rows,
                   stride_words, sign_words_ptr, residual_norms_ptr, stride_sign_words, BITS, PROD)
    for slot in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(slot))


def _fp16_pairs(values: torch.Tensor) -> torch.Tensor:
    """int32 words of two equal halves, each value rounded to fp16 (the operands :func:`_f16x2_code_lines` reads),
    made on ``values``' device."""
    halves = values.half().view(torch.int16).to(torch.int32) & 0xFFFF
    return halves | halves << 16


@functools.lru_cache(maxsize=64)
def _positive_midpoints(midpoints: bytes, device: str) -> torch.Tensor:
    """The 2^(b-1) - 1 positive midpoints of a symmetric codebook as fp16 pairs (:func:`_fp16_pairs`), padded with
    zeros to 7 words, on ``device`` (built once per codebook and device: the launch then copies nothing from the
    host, as a CUDA-graph capture needs)."""
    bnd = np.frombuffer(midpoints, dtype=np.float64)
    if not np.allclose(bnd, -bnd[::-1], rtol=0, atol=1e-7) or np.any(np.diff(bnd) <= 0):
        raise ValueError("the warpgroup-MMA quantize kernel needs sorted symmetric midpoints (a Lloyd-Max codebook)")
    padded = np.zeros(7)
    positive = bnd[bnd.size // 2 + 1:]
    padded[:positive.size] = positive
    return _fp16_pairs(torch.tensor(padded, device=device))


def quantize_mse_wgmma(x: torch.Tensor, rotation_matrix: torch.Tensor, boundaries: np.ndarray, bits: int,
                       norms_dtype: torch.dtype = torch.float32, programs_per_sm: int = 3,
                       stages: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes and norms of ``x`` (..., 128) float16 or bfloat16 as
    :func:`~turboquant.kernels.quantize.quantize_mse_triton` returns them (inputs checked there and by
    :func:`wgmma_quantize_unsupported`), computed by :func:`quantize_wgmma_kernel`; ``boundaries`` the codebook's
    midpoints as float64; ``programs_per_sm``: resident programs per SM (the register budget of each, ``maxnreg``, is
    set so that they fit, and at most as many as the shared memory holds); ``stages``: the tiles in flight, the
    kernel's ``STAGES``."""
    rows, lead_shape = as_rows(x)
    codes = torch.empty((rows.shape[0], packed_size(HEAD_DIM, bits)), dtype=torch.uint8, device=x.device)
    norms = torch.empty((rows.shape[0],), dtype=norms_dtype, device=x.device)
    _launch(rows, rotation_matrix, boundaries, bits, codes, norms, None, programs_per_sm, stages)
    return codes.reshape(*lead_shape, codes.shape[-1]), norms.reshape(lead_shape)


def quantize_prod_wgmma(x: torch.Tensor, rotation_matrix: torch.Tensor, boundaries: np.ndarray,
                        centroids: torch.Tensor, mse_bits: int, qjl_matrix: torch.Tensor,
                        norms_dtype: torch.dtype = torch.float32, programs_per_sm: int = 2,
                        stages: int = 2) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """TurboQuant_prod (Algorithm 2) of ``x`` (..., 128) float16 or bfloat16 as
    :func:`~turboquant.kernels.quantize_prod.quantize_prod_triton` returns it (codes, signs, norms, residual norms;
    inputs checked there and by :func:`wgmma_quantize_unsupported`), by :func:`quantize_wgmma_kernel` with ``PROD``:
    ``mse_bits`` 1-3, a symmetric codebook; ``programs_per_sm``, ``stages`` as :func:`quantize_mse_wgmma`'s."""
    rows, lead_shape = as_rows(x)
    n_rows = rows.shape[0]
    codes = torch.empty((n_rows, packed_size(HEAD_DIM, mse_bits)), dtype=torch.uint8, device=x.device)
    signs = torch.empty((n_rows, packed_size(HEAD_DIM, 1)), dtype=torch.uint8, device=x.device)
    norms = torch.empty((n_rows,), dtype=norms_dtype, device=x.device)
    residual_norms = torch.empty((n_rows,), dtype=norms_dtype, device=x.device)
    prod = (_sketch_operand(rotation_matrix, qjl_matrix, mse_bits), _positive_magnitudes(centroids), signs,
            residual_norms)
    _launch(rows, rotation_matrix, boundaries, mse_bits, codes, norms, prod, programs_per_sm, stages)
    return (codes.reshape(*lead_shape, codes.shape[-1]), signs.reshape(*lead_shape, signs.shape[-1]),
            norms.reshape(lead_shape), residual_norms.reshape(lead_shape))


def _launch(rows: torch.Tensor, rotation_matrix: torch.Tensor, boundaries: np.ndarray, bits: int,
            codes: torch.Tensor, norms: torch.Tensor, prod: tuple | None, programs_per_sm: int, stages: int) -> None:
    """One persistent launch of :func:`quantize_wgmma_kernel` over ``rows`` (``prod``: the sketch operand, the
    positive centroids, the sign and residual-norm outputs), ``stages`` tiles in flight, ``programs_per_sm`` programs
    of one warpgroup resident per SM within its 64K registers and its shared memory. TMA reads rows whose start and
    stride are multiples of 16 bytes: other rows (a view at an odd offset) are copied first."""
    n_rows = rows.shape[0]
    if not n_rows:
        return
    if stages < 2:
        raise ValueError(f"the quantize kernel stages at least 2 tiles of rows in shared memory, got stages={stages}")
    if rows.data_ptr() % 16 or (rows.stride(0) * rows.element_size()) % 16:
        rows = rows.clone(memory_format=torch.contiguous_format)
    mids = _positive_midpoints(np.asarray(boundaries, dtype=np.float64).tobytes(), str(rows.device))
    sketch, magnitudes, signs, residual_norms = prod if prod is not None else (rows, mids, codes, norms)
    b = _code_operand(rotation_matrix, bits)
    x_desc = TensorDescriptor(rows, list(rows.shape), list(rows.stride()), [BLOCK_M.value, HEAD_DIM],
                              SHARED_ROWS.value)
    operands = 1 + (prod is not None)
    shared = operands * OPERAND_BYTES + stages * ROW_TILE_BYTES.value
    programs_per_sm = max(1, min(programs_per_sm, blocks_fitting_shared_memory(rows.device, shared)))
    n_sm = torch.cuda.get_device_properties(rows.device).multi_processor_count if rows.is_cuda else 4
    grid = (min(triton.cdiv(n_rows, BLOCK_M.value), programs_per_sm * n_sm),)
    quantize_wgmma_kernel[grid](x_desc, b, mids, codes.view(torch.int32), norms,
                                n_rows, codes.shape[1] // 4, sketch, magnitudes, signs.view(torch.int32),
                                residual_norms, signs.shape[1] // 4, BITS=bits, PROD=prod is not None, STAGES=stages,
                                num_warps=4, maxnreg=min(255, 65536 // (128 * programs_per_sm) // 8 * 8))


def _code_operand(rotation_matrix: torch.Tensor, bits: int) -> torch.Tensor:
    """B = Pi^T (128 x 128 fp16) with columns in :func:`code_column_order` of ``bits``."""
    return rotation_matrix.T[:, code_column_order(bits, rotation_matrix.device)].to(torch.float16).contiguous()


def _sketch_operand(rotation_matrix: torch.Tensor, qjl_matrix: torch.Tensor, mse_bits: int) -> torch.Tensor:
    """The second ``wgmma``'s B: (S Pi^T)^T (128 x 128 fp16), rows (the residual's rotated channels, as the first
    product's accumulator holds them) in :func:`code_column_order` of ``mse_bits``, columns (the sign channels) in
    that of 1-bit codes (the signs are stored as such, :func:`_pair_signs`)."""
    rows = code_column_order(mse_bits, rotation_matrix.device)
    cols = code_column_order(1, rotation_matrix.device)
    sketch = qjl_matrix.to(torch.float64) @ rotation_matrix.to(torch.float64).T
    return sketch[cols][:, rows].T.to(torch.float16).contiguous()


def _positive_magnitudes(centroids: torch.Tensor) -> torch.Tensor:
    """The positive half g0 < g1 < ... of the symmetric codebook (2, 4 or 8 centroids) whose midpoints
    :func:`_positive_midpoints` checked, as fp16 pairs (:func:`_fp16_pairs`) padded with zeros to 4 words, made on
    its device (no host copy: a CUDA-graph capture may call it)."""
    values = centroids.detach().to(torch.float32).flatten()
    if values.numel() not in (2, 4, 8):
        raise ValueError(f"the warpgroup-MMA prod kernel reads codebooks of 2, 4 or 8 centroids, got {values.numel()}")
    return _fp16_pairs(torch.nn.functional.pad(values[values.numel() // 2:], (0, 4 - values.numel() // 2)))
