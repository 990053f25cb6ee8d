"""Packed 4-bit codes as register operands of ``mma.sync`` (Gluon): the word layouts, the in-register decoder and the
channel orders they fix, shared by the decode-attention and scores kernels that read TurboQuant_mse codes.

Fragment of ``mma.m16n8k16`` (lane = 4g + t): the A operand holds rows g, g + 8 and columns 2t, 2t + 1, 2t + 8, 2t + 9
of each 16 x 16 block, two fp16 values per 32-bit register. A kernel loads into each lane exactly the code words of
those rows and columns (:func:`key_words_layout`, :func:`value_words_layout`), decodes them in registers
(:data:`~turboquant.kernels._decode.PRMT_PAIR4`, whose output registers are the operand's fp16 pairs) and hands the
tile to ``mma_v2`` with no data movement (the conversions below are compiled with ``assert_trivial``). Which
rotated channel lands where is therefore fixed by the fragment: :func:`key_channel_order` (the reduction positions of
``K~ Q^T``, tokens as rows) and :func:`value_channel_order` (the rows of ``V~^T P^T``, tokens as columns). Only the
row of 128 channels (64 bytes, 16 words) of head_dim 128 is laid out here.
"""
from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ._decode import PRMT_PAIR4, PRMT_PAIR4_CONSTRAINTS

MMA = gl.constexpr(gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 1], instr_shape=[16, 8]))
OPERAND_A = gl.constexpr(gl.DotOperandLayout(operand_index=0, parent=MMA.value, k_width=2))
OPERAND_B = gl.constexpr(gl.DotOperandLayout(operand_index=1, parent=MMA.value, k_width=2))
ROWS = gl.constexpr(gl.BlockedLayout([1, 4], [8, 4], [1, 1], [1, 0]))  # a plain one-warp layout for small loads

HEAD_DIM = 128

def key_channel_order(dim: int = HEAD_DIM) -> torch.Tensor:
    """Rotated channel at each position k of the key reduction. With k = u0 + 2t + 8c + 64 u1, lane t of a fragment
    decodes words 4t + 2 u1 + u0 of its token (channels 8 (4t + 2 u1 + u0) + c), and code c of that word lands at
    position k: u0 is the pair a 32-bit operand register holds, t the lane, c and u1 the +8 column and the
    16-column blocks of the fragment."""
    k = torch.arange(dim)
    u0, t, c, u1 = k & 1, (k >> 1) & 3, (k >> 3) & 7, k >> 6
    return 8 * (4 * t + 2 * u1 + u0) + c


def value_channel_order(dim: int = HEAD_DIM) -> torch.Tensor:
    """Rotated channel of each output row m of the value product. With m = g + 8w + 16c, lane group g decodes words
    2g + w of a token (channels 16g + 8w + c), and code c of word w is row m."""
    m = torch.arange(dim)
    return 16 * (m & 7) + 8 * ((m >> 3) & 1) + (m >> 4)


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
def _decode_pairs(words, tables):
    """The 8 code planes of word pairs (consecutive registers of ``words``): fp16 tensors of ``words``' shape."""
    return gl.inline_asm_elementwise(PRMT_PAIR4, PRMT_PAIR4_CONSTRAINTS,
                                     [words, tables[0], tables[1], tables[2], tables[3]],
                                     dtype=(gl.float16,) * 8, is_pure=True, pack=2)


@gluon.jit
def _join_planes(v):
    """The 8 planes of :func:`_decode_pairs` as one tensor with three more axes (c0, c1, c2)."""
    return gl.join(gl.join(gl.join(v[0], v[1]), gl.join(v[2], v[3])), gl.join(gl.join(v[4], v[5]), gl.join(v[6], v[7])))


@gluon.jit
def decoded_keys(words, tables, BLOCK_N: gl.constexpr):
    """(BLOCK_N, 16) key words -> (BLOCK_N, 128) fp16 in the A layout, columns in :func:`key_channel_order`."""
    x = _join_planes(_decode_pairs(words, tables))
    x = gl.permute(gl.reshape(x, (BLOCK_N, 2, 2, 2, 2, 2, 2, 2)), KEY_AXES.value)
    return gl.convert_layout(gl.reshape(x, (BLOCK_N, 128)), OPERAND_A, assert_trivial=True)


@gluon.jit
def decoded_values(words, tables, BLOCK_N: gl.constexpr):
    """(BLOCK_N, 16) value words -> (128, BLOCK_N) fp16 in the A layout, rows in :func:`value_channel_order`."""
    words = gl.convert_layout(words, value_words_layout(BLOCK_N, True), assert_trivial=True)
    x = _join_planes(_decode_pairs(words, tables))
    x = gl.permute(gl.reshape(x, (BLOCK_N, 8, 2, 2, 2, 2)), VALUE_AXES.value)
    return gl.convert_layout(gl.reshape(x, (128, BLOCK_N)), OPERAND_A, assert_trivial=True)
