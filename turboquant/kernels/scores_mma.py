"""Attention logits from 3- and 4-bit TurboQuant_mse keys, the decoded keys as register operands of ``mma.sync``
(Gluon).

The math of :mod:`turboquant.kernels.scores`, ``scale * n_t <Pi q, c[idx_t]>``, for the layout the register
operands serve (:func:`mma_scores_unsupported`: 3- or 4-bit codes of 128 channels, a sorted symmetric codebook, at
most 16 queries per key set, e.g. the GQA group of a KV head). One program is one warp and walks ``TILES`` tiles of
``BLOCK_N`` keys: each lane loads the code words of its ``mma.m16n8k16`` fragment, decodes them in registers and
multiplies them with the queries (:mod:`turboquant.kernels._mma`), ``s^T = K~ Q^T`` (keys x queries, the queries
padded to 8 or 16 columns), so no decoded key is staged through shared memory. The host gathers the rotated queries
in the fragment's channel order (:func:`~turboquant.kernels._mma.key_channel_order`).
"""
from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from ..codebook import symmetric_codebook
from ._decode import prmt_byte_tables
from ._mma import HEAD_DIM, MMA, OPERAND_B, ROWS, decoded_keys, key_channel_order, key_slots, key_words_layout

MAX_QUERIES = 16


def mma_scores_unsupported(q_rot: torch.Tensor, codes: torch.Tensor, centroids: torch.Tensor, bits: int) -> str | None:
    """Why :func:`mma_scores` cannot compute these scores, or None (the inputs themselves are checked by the
    caller, ``scores._check``)."""
    if bits not in (3, 4) or q_rot.shape[-1] != HEAD_DIM:
        return f"the register-operand kernel reads 3- and 4-bit codes of {HEAD_DIM} channels"
    if q_rot.shape[1] > MAX_QUERIES:
        return f"the register-operand kernel serves at most {MAX_QUERIES} queries per key set"
    if codes.stride(-1) != 1 or any(s % 4 for s in codes.stride()[:-1]) or codes.data_ptr() % 4:
        return "the register-operand kernel reads code rows as 32-bit words (contiguous, 4-byte aligned rows)"
    if not symmetric_codebook(centroids):
        return "the register-operand kernel decodes sorted symmetric (Lloyd-Max) codebooks"
    return None


@gluon.jit
def _load_tile(words_row, norms_row, n0, n_keys, w_tok, w_slot, s_tok, w_stride, n_stride, BLOCK_N: gl.constexpr,
               BITS: gl.constexpr):
    """The key slots (fragment layout) and float32 norms of keys ``n0 .. n0 + BLOCK_N - 1`` (zero past ``n_keys``)."""
    kt = n0 + w_tok
    words = key_slots(words_row, kt, kt < n_keys, w_slot, w_stride, BLOCK_N, BITS)
    st = n0 + s_tok
    norms = gl.load(norms_row + st * n_stride, mask=st < n_keys, other=0.0).to(gl.float32)
    return words, norms


@gluon.jit
def mma_scores_kernel(
    q_ptr, words_ptr, norms_ptr, out_ptr, tables, n_queries, n_keys, q_strides, w_strides, n_strides, out_strides,
    scale, HEADS: gl.constexpr, BLOCK_N: gl.constexpr, TILES: gl.constexpr, PREFETCH: gl.constexpr,
    BITS: gl.constexpr,
):
    """One (key set b, run of ``TILES * BLOCK_N`` keys), one warp. ``q_ptr``: (sets, queries, 128) fp16 rotated
    queries in key order; ``words_ptr``: the packed code rows as int32 words (strides in words) of ``BITS``-bit
    codes; ``tables``: the codebook's byte tables; ``PREFETCH``: the next tile's loads are issued before this tile
    is decoded."""
    b = gl.program_id(0).to(gl.int64)
    start = gl.program_id(1) * (TILES * BLOCK_N)
    end = gl.minimum(start + TILES * BLOCK_N, n_keys)

    k_rows = gl.arange(0, 128, layout=gl.SliceLayout(1, ROWS))
    h_cols = gl.arange(0, HEADS, layout=gl.SliceLayout(0, ROWS))
    q_t = gl.load(q_ptr + b * q_strides[0] + h_cols[None, :] * q_strides[1] + k_rows[:, None],
                  mask=(h_cols < n_queries)[None, :], other=0.0)
    q_t = gl.convert_layout(q_t, OPERAND_B)

    WORDS: gl.constexpr = key_words_layout(BLOCK_N)
    w_tok = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, WORDS))
    w_slot = gl.arange(0, 16, layout=gl.SliceLayout(0, WORDS))
    s_tok = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, MMA))
    heads = gl.arange(0, HEADS, layout=gl.SliceLayout(0, MMA))
    words_row = words_ptr + b * w_strides[0]
    norms_row = norms_ptr + b * n_strides[0]
    out_row = out_ptr + b * out_strides[0] + heads[None, :] * out_strides[1]
    if PREFETCH:
        words, norms = _load_tile(words_row, norms_row, start, end, w_tok, w_slot, s_tok, w_strides[1], n_strides[1],
                                  BLOCK_N, BITS)
    for n0 in range(start, end, BLOCK_N):
        if PREFETCH:
            next_tile = _load_tile(words_row, norms_row, n0 + BLOCK_N, end, w_tok, w_slot, s_tok, w_strides[1],
                                   n_strides[1], BLOCK_N, BITS)
        else:
            words, norms = _load_tile(words_row, norms_row, n0, end, w_tok, w_slot, s_tok, w_strides[1], n_strides[1],
                                      BLOCK_N, BITS)
        s = mma_v2(decoded_keys(words, tables, BLOCK_N, BITS, "prmt"), q_t,
                   gl.zeros((BLOCK_N, HEADS), gl.float32, layout=MMA))
        s = s * (norms * scale)[:, None]
        keys = n0 + s_tok
        gl.store(out_row + keys[:, None], s.to(out_ptr.dtype.element_ty),
                 mask=(keys < end)[:, None] & (heads < n_queries)[None, :])
        if PREFETCH:
            words, norms = next_tile


def mma_scores(q_rot: torch.Tensor, codes: torch.Tensor, norms: torch.Tensor, centroids: torch.Tensor, bits: int,
               scale: float, out: torch.Tensor, block_n: int = 32, tiles: int = 8, prefetch: bool = True) -> None:
    """Write ``scale * <q_rot[b, i], c[codes[b, t]]> * norms[b, t]`` into ``out`` (sets, queries, keys) with
    :func:`mma_scores_kernel` (inputs as :func:`~turboquant.kernels.scores.mse_scores_triton` takes them, checked
    there and by :func:`mma_scores_unsupported`)."""
    batch, n_queries, _ = q_rot.shape
    n_keys = codes.shape[1]
    q_key = q_rot[..., key_channel_order(HEAD_DIM, q_rot.device)].to(torch.float16).contiguous()
    words = codes.view(torch.int32)
    if norms.stride(-1) != 1:
        norms = norms.contiguous()
    grid = (batch, triton.cdiv(n_keys, tiles * block_n))
    mma_scores_kernel[grid](
        q_key, words, norms, out, prmt_byte_tables(centroids), n_queries, n_keys, q_key.stride()[:2],
        words.stride()[:2], norms.stride(), out.stride()[:2], scale,
        HEADS=8 if n_queries <= 8 else 16, BLOCK_N=block_n, TILES=tiles, PREFETCH=prefetch, BITS=bits, num_warps=1,
    )
