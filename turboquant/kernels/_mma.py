"""Packed 4-bit codes as register operands of ``mma.sync`` (Gluon): the word layouts, the in-register decoder and the
channel orders they fix, shared by the decode-attention and scores kernels that read TurboQuant_mse codes.

Fragment of ``mma.m16n8k16`` (lane = 4g + t): the A operand holds rows g, g + 8 and columns 2t, 2t + 1, 2t + 8, 2t + 9
of each 16 x 16 block, two fp16 values per 32-bit register. A kernel loads into each lane exactly the code words of
those rows and columns (:func:`key_words_layout`, :func:`value_words_layout`), decodes them in registers
(:data:`~turboquant.kernels._decode.PRMT_PAIR4` / ``PRMT_PAIR3``, whose output registers are the operand's fp16
pairs) and hands the tile to ``mma_v2`` with no data movement (the conversions below are compiled with
``assert_trivial``). Which rotated channel lands where is therefore fixed by the fragment: :func:`key_channel_order`
(the reduction positions of ``K~ Q^T``, tokens as rows) and :func:`value_channel_order` (the rows of ``V~^T P^T``,
tokens as columns). The unit is a *slot*, the 8 codes of 8 consecutive channels in one 32-bit register: a word of
4-bit codes, or a 24-bit group of 3-bit codes cut out of the loaded words (:func:`key_slots`, :func:`value_slots`),
so both widths share the layouts and the orders. Only rows of 128 channels (head_dim 128) are laid out here.
"""
from __future__ import annotations

import functools

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ._decode import PRMT_PAIR3, PRMT_PAIR3_CONSTRAINTS, PRMT_PAIR4, PRMT_PAIR4_CONSTRAINTS

MMA = gl.constexpr(gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 1], instr_shape=[16, 8]))
OPERAND_A = gl.constexpr(gl.DotOperandLayout(operand_index=0, parent=MMA.value, k_width=2))
OPERAND_B = gl.constexpr(gl.DotOperandLayout(operand_index=1, parent=MMA.value, k_width=2))
ROWS = gl.constexpr(gl.BlockedLayout([1, 4], [8, 4], [1, 1], [1, 0]))  # a plain one-warp layout for small loads

HEAD_DIM = 128

@functools.cache
def key_channel_order(dim: int = HEAD_DIM, device: torch.device | str = "cpu") -> torch.Tensor:
    """Rotated channel at each position k of the key reduction. With k = u0 + 2t + 8c + 64 u1, lane t of a fragment
    decodes words 4t + 2 u1 + u0 of its token (channels 8 (4t + 2 u1 + u0) + c), and code c of that word lands at
    position k: u0 is the pair a 32-bit operand register holds, t the lane, c and u1 the +8 column and the
    16-column blocks of the fragment. Made once per ``device`` (a CUDA-graph capture may index with it) and
    shared: not to be modified."""
    k = torch.arange(dim)
    u0, t, c, u1 = k & 1, (k >> 1) & 3, (k >> 3) & 7, k >> 6
    return (8 * (4 * t + 2 * u1 + u0) + c).to(device)


@functools.cache
def value_channel_order(dim: int = HEAD_DIM, device: torch.device | str = "cpu") -> torch.Tensor:
    """Rotated channel of each output row m of the value product. With m = g + 8w + 16c, lane group g decodes words
    2g + w of a token (channels 16g + 8w + c), and code c of word w is row m. Made once per ``device``, shared."""
    m = torch.arange(dim)
    return (16 * (m & 7) + 8 * ((m >> 3) & 1) + (m >> 4)).to(device)


# How a decoded tile's axes become the MMA operand. PRMT_PAIR4's 8 outputs (code c of a word pair) are joined pairwise,
# outputs 2i and 2i + 1 innermost, which appends the bits of c as axes, least significant first.
# Keys: (token, word as t1 t0 u1 u0, c0 c1 c2) -> (token, u1 c2 c1 c0 t1 t0 u0): column k = u0 + 2t + 8c + 64 u1.
KEY_AXES = gl.constexpr((0, 3, 7, 6, 5, 1, 2, 4))
# Values: (token, word as g w, c0 c1 c2) -> (c2 c1 c0 w g, token): row m = g + 8w + 16c.
VALUE_AXES = gl.constexpr((5, 4, 3, 2, 1, 0))


@gluon.constexpr_function
def key_words_layout(block_n):
    """(BLOCK_N tokens, 16 words): lane 4g + t holds words 4t..4t+3 (one 16-byte load) of tokens g + 8r; words 4t + 2u1
    and 4t + 2u1 + 1 are consecutive registers (the pair PRMT_PAIR4 decodes)."""
    tokens = [[8 << i, 0] for i in range(block_n.bit_length() - 4)]
    return gl.DistributedLinearLayout([[0, 1], [0, 2]] + tokens, [[0, 4], [0, 8], [1, 0], [2, 0], [4, 0]], [], [],
                                      [block_n, 16])


@gluon.constexpr_function
def value_words_layout(block_n, pairs_first):
    """(BLOCK_N tokens, 16 words): lane 4g + t holds words 2g, 2g + 1 of tokens 2t + {0, 1} + 8r. Loaded with the two
    words of a token in consecutive registers (one 8-byte load); decoded with tokens 2t and 2t + 1 consecutive
    (``pairs_first``: the pair PRMT_PAIR4 decodes). The two differ only in register order."""
    word, pair = [0, 1], [1, 0]
    tokens = [[8 << i, 0] for i in range(block_n.bit_length() - 4)]
    return gl.DistributedLinearLayout([pair, word] + tokens if pairs_first else [word, pair] + tokens,
                                      [[2, 0], [4, 0], [0, 2], [0, 4], [0, 8]], [], [], [block_n, 16])


@gluon.jit
def _row_words(rows, tokens, live, stride, cols):
    """int32 words ``cols`` (a 1-D tensor over the slot axis) of the rows of ``tokens`` (0 where not ``live``)."""
    return gl.load(rows + tokens.to(gl.int64)[:, None] * stride + cols[None, :], mask=live, other=0)


@gluon.jit
def key_slots(rows, tokens, tok_mask, slot, stride, BLOCK_N: gl.constexpr, BITS: gl.constexpr):
    """(BLOCK_N, 16) int32 *slots* of key rows in :func:`key_words_layout`: slot 4t + i holds the 8 codes of rotated
    channels 32t + 8i .. 32t + 8i + 7 (``slot``: the slot index, an arange over the layout's column axis). 4-bit rows:
    the slot is word 4t + i (one 16-byte load per lane). 3-bit rows (12 words): lane t loads words 3t .. 3t + 2 (96
    bits, its 32 channels) into slots 4t .. 4t + 2 and cuts them into four 24-bit group words."""
    if BITS == 4:
        words = _row_words(rows, tokens, tok_mask[:, None], stride, slot)
    else:
        i = slot & 3
        loaded = _row_words(rows, tokens, tok_mask[:, None] & (i < 3)[None, :], stride, 3 * (slot >> 2) + i)
        loaded = gl.reshape(loaded.to(gl.uint32, bitcast=True), (BLOCK_N, 4, 2, 2))  # token, t, i1, i0
        even, odd = gl.split(loaded)  # i0 = 0: words i = 0, 2; i0 = 1: words 1, 3 (3 unused)
        w0, w2 = gl.split(even)
        w1, _ = gl.split(odd)
        g0 = w0 & 0xFFFFFF
        g1 = (w0 >> 24) | ((w1 & 0xFFFF) << 8)
        g2 = (w1 >> 16) | ((w2 & 0xFF) << 16)
        g3 = w2 >> 8
        words = gl.reshape(gl.join(gl.join(g0, g2), gl.join(g1, g3)), (BLOCK_N, 16)).to(gl.int32, bitcast=True)
        words = gl.convert_layout(words, key_words_layout(BLOCK_N), assert_trivial=True)
    return words


@gluon.jit
def value_slots(rows, tokens, tok_mask, slot, stride, BLOCK_N: gl.constexpr, BITS: gl.constexpr):
    """(BLOCK_N, 16) int32 slots of value rows in ``value_words_layout(BLOCK_N, False)``: slot 2g + w holds the 8 codes
    of rotated channels 16g + 8w .. 16g + 8w + 7. 4-bit rows: the slot is word 2g + w (one 8-byte load per lane and
    token). 3-bit rows: lane g's 48 bits start at bit 48g, inside words floor(3g / 2) and the next; both are loaded
    and the two 24-bit group words cut out at bit offset 16 (g odd) or 0."""
    if BITS == 4:
        words = _row_words(rows, tokens, tok_mask[:, None], stride, slot)
    else:
        g = slot >> 1
        loaded = _row_words(rows, tokens, tok_mask[:, None], stride, 3 * (g >> 1) + (g & 1) + (slot & 1))
        low, high = gl.split(gl.reshape(loaded.to(gl.uint32, bitcast=True), (BLOCK_N, 8, 2)))
        offset, _ = gl.split(gl.reshape(gl.zeros_like(loaded) + (16 * (g & 1))[None, :], (BLOCK_N, 8, 2)))
        both = low.to(gl.uint64) | (high.to(gl.uint64) << 32)
        first = (both >> offset.to(gl.uint64)) & 0xFFFFFF
        second = (both >> (offset + 24).to(gl.uint64)) & 0xFFFFFF
        words = gl.reshape(gl.join(first, second).to(gl.uint32), (BLOCK_N, 16)).to(gl.int32, bitcast=True)
        words = gl.convert_layout(words, value_words_layout(BLOCK_N, False), assert_trivial=True)
    return words


@gluon.jit
def _decode_pairs(words, tables, BITS: gl.constexpr):
    """The 8 code planes of slot pairs (consecutive registers of ``words``): fp16 tensors of ``words``' shape."""
    if BITS == 4:
        planes = gl.inline_asm_elementwise(PRMT_PAIR4, PRMT_PAIR4_CONSTRAINTS,
                                           [words, tables[0], tables[1], tables[2], tables[3]],
                                           dtype=(gl.float16,) * 8, is_pure=True, pack=2)
    else:
        planes = gl.inline_asm_elementwise(PRMT_PAIR3, PRMT_PAIR3_CONSTRAINTS,
                                           [words, tables[0], tables[1], tables[2], tables[3]],
                                           dtype=(gl.float16,) * 8, is_pure=True, pack=2)
    return planes


@gluon.jit
def _join_planes(v):
    """The 8 planes of :func:`_decode_pairs` as one tensor with three more axes (c0, c1, c2)."""
    return gl.join(gl.join(gl.join(v[0], v[1]), gl.join(v[2], v[3])), gl.join(gl.join(v[4], v[5]), gl.join(v[6], v[7])))


@gluon.jit
def decoded_keys(words, tables, BLOCK_N: gl.constexpr, BITS: gl.constexpr):
    """(BLOCK_N, 16) key slots -> (BLOCK_N, 128) fp16 in the A layout, columns in :func:`key_channel_order`."""
    x = _join_planes(_decode_pairs(words, tables, BITS))
    x = gl.permute(gl.reshape(x, (BLOCK_N, 2, 2, 2, 2, 2, 2, 2)), KEY_AXES.value)
    return gl.convert_layout(gl.reshape(x, (BLOCK_N, 128)), OPERAND_A, assert_trivial=True)


@gluon.jit
def decoded_values(words, tables, BLOCK_N: gl.constexpr, BITS: gl.constexpr):
    """(BLOCK_N, 16) value slots -> (128, BLOCK_N) fp16 in the A layout, rows in :func:`value_channel_order`."""
    words = gl.convert_layout(words, value_words_layout(BLOCK_N, True), assert_trivial=True)
    x = _join_planes(_decode_pairs(words, tables, BITS))
    x = gl.permute(gl.reshape(x, (BLOCK_N, 8, 2, 2, 2, 2)), VALUE_AXES.value)
    return gl.convert_layout(gl.reshape(x, (128, BLOCK_N)), OPERAND_A, assert_trivial=True)
