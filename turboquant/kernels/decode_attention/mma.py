"""The split kernel of decode attention with the decoded codes as register operands of ``mma.sync`` (Gluon).

Same math as :mod:`.kernel` (the package docstring), for the layouts it serves
(:meth:`CacheFormat.mma_unsupported`): one TurboQuant_mse channel group per stream, 3- or 4-bit keys and values, or
both streams split as the 3.5-bit preset splits them (32 outlier channels at 4 bits, 96 at 3); head_dim 128, a GQA
group of at most 16 query heads. One program is one warp and owns (batch row, KV head, split);
per tile of ``BLOCK_N`` tokens it computes

    s^T = K~ Q^T           (BLOCK_N, H):   A = the decoded keys (tokens x channels), B = the rotated queries
    o^T += V~^T (p n_V)^T  (128, H):       A = the decoded values (channels x tokens), B = the probabilities

with ``mma.m16n8k16`` (fp16 operands, fp32 accumulation), H the GQA group padded to 8 or 16. A split stream
(``SPLIT``) has two norms per token; its outliers sit in whole key blocks and known value rows
(``turboquant.kernels._mma``), so

    s^T = n_0 (K~_0 Q_0^T) + n_1 (K~ Q_1^T)    K~_0, Q_0: the outlier positions alone; Q_1: the others (zero there)
    o^T += V~^T (p n_V1)^T, kept for the 3-bit rows;   V~_top^T (p n_V0)^T (rows m < 64), kept for the outlier rows

one decode of each tile; second (cheap) MMAs instead of a per-element scale. Both A operands are
decoded in registers in the layout the instruction reads them from (:mod:`turboquant.kernels._mma`), so no decoded
tile is written to shared memory. The host gathers the rotated query in the key order
(:attr:`CacheFormat.mma_query_map`), and the kernel writes output row m to rotated channel
``value_channel_order[m]``, so the merge and rotate kernels are shared with the tile kernel.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from .._decode import PAIR_LUT_BYTES
from .._layout import blocks_fitting_shared_memory
from .._mma import (
    MMA,
    OPERAND_B,
    ROWS,
    SPLIT_43,
    SPLIT_BITS,
    SPLIT_OUTLIER_ROWS,
    cut_key_slots,
    cut_split_key_slots,
    cut_split_value_slots,
    cut_value_slots,
    decoded_keys,
    decoded_split_keys,
    decoded_split_values,
    decoded_values,
    fill_pair_lut,
    gather_words,
    key_slot_source,
    key_words_layout,
    row_loads_serve,
    split_key_slot_source,
    split_value_slot_sources,
    tile_words,
    value_slot_source,
    value_words_layout,
)

if TYPE_CHECKING:
    from ...codes import QuantizedVectors
    from .format import CacheFormat


@gluon.jit
def _word_sources(k_words, v_words, k0_words, v0_words, n0, end, k_tok, k_slot, v_tok, v_slot, k_strides, v_strides,
                  k0_strides, v0_strides, KEY_BITS: gl.constexpr, VALUE_BITS: gl.constexpr, SPLIT: gl.constexpr):
    """(pointers, live mask) of the code words of tokens ``n0 .. n0 + BLOCK_N - 1`` (live below ``end``): keys, values
    and, with ``SPLIT``, the values' outlier words (for one group: the values' again, unread)."""
    kt = n0 + k_tok
    vt = n0 + v_tok
    if SPLIT:
        kp, kl = split_key_slot_source(k0_words, k_words, kt, kt < end, k_slot, k0_strides[2], k_strides[2])
        vp, vl, op, ol = split_value_slot_sources(v0_words, v_words, vt, vt < end, v_slot, v0_strides[2],
                                                  v_strides[2])
    else:
        kp, kl = key_slot_source(k_words, kt, kt < end, k_slot, k_strides[2], KEY_BITS)
        vp, vl = value_slot_source(v_words, vt, vt < end, v_slot, v_strides[2], VALUE_BITS)
        op, ol = vp, vl
    return kp, kl, vp, vl, op, ol


@gluon.jit
def _cut_slots(k_loaded, v_loaded, o_loaded, k_slot, v_slot, BLOCK_N: gl.constexpr, KEY_BITS: gl.constexpr,
               VALUE_BITS: gl.constexpr, SPLIT: gl.constexpr):
    """The key and value slots (fragment layouts) from the words :func:`_word_sources` names."""
    if SPLIT:
        kw = cut_split_key_slots(k_loaded, k_slot, BLOCK_N)
        vw = cut_split_value_slots(v_loaded, o_loaded, v_slot, BLOCK_N)
    else:
        kw = cut_key_slots(k_loaded, BLOCK_N, KEY_BITS)
        vw = cut_value_slots(v_loaded, v_slot, BLOCK_N, VALUE_BITS)
    return kw, vw


@gluon.jit
def _load_norms(k_norms, v_norms, k0_norms, v0_norms, n0, end, s_tok, kn_strides, vn_strides, kn0_strides,
                vn0_strides, SPLIT: gl.constexpr):
    """float32 norms of tokens ``n0 .. n0 + BLOCK_N - 1`` (zero from ``end`` on): keys, values and, with ``SPLIT``,
    the outlier groups' (else zeros, unread)."""
    st = n0 + s_tok
    kn = gl.load(k_norms + st * kn_strides[2], mask=st < end, other=0.0).to(gl.float32)
    vn = gl.load(v_norms + st * vn_strides[2], mask=st < end, other=0.0).to(gl.float32)
    if SPLIT:
        kn0 = gl.load(k0_norms + st * kn0_strides[2], mask=st < end, other=0.0).to(gl.float32)
        vn0 = gl.load(v0_norms + st * vn0_strides[2], mask=st < end, other=0.0).to(gl.float32)
    else:
        kn0 = gl.zeros_like(kn)
        vn0 = kn0
    return kn, vn, kn0, vn0


@gluon.jit
def _load_words(sources, SPLIT: gl.constexpr):
    """The words :func:`_word_sources` names, loaded into registers (the outlier words only with ``SPLIT``)."""
    kp, kl, vp, vl, op, ol = sources
    k_loaded = gather_words(kp, kl)
    v_loaded = gather_words(vp, vl)
    if SPLIT:
        o_loaded = gather_words(op, ol)
    else:
        o_loaded = v_loaded
    return k_loaded, v_loaded, o_loaded


@gluon.jit
def _tile_loads(k_words, v_words, k0_words, v0_words, n0, end, k_tok, k_slot, v_tok, v_slot, k_strides, v_strides,
                k0_strides, v0_strides, BLOCK_N: gl.constexpr, KEY_BITS: gl.constexpr, VALUE_BITS: gl.constexpr,
                SPLIT: gl.constexpr, K_ROW: gl.constexpr, V_ROW: gl.constexpr, ROW_LOADS: gl.constexpr):
    """The code words of tokens ``n0 .. n0 + BLOCK_N - 1`` (live below ``end``): by
    :func:`~turboquant.kernels._mma.tile_words` with ``ROW_LOADS`` (:func:`mma_split_kernel`), else
    :func:`_load_words`."""
    if ROW_LOADS and not SPLIT:
        k_loaded = tile_words(k_words + n0 * K_ROW, end - n0, "key", KEY_BITS, K_ROW, BLOCK_N)
        v_loaded = tile_words(v_words + n0 * V_ROW, end - n0, "value", VALUE_BITS, V_ROW, BLOCK_N)
        o_loaded = v_loaded
    else:
        k_loaded, v_loaded, o_loaded = _load_words(
            _word_sources(k_words, v_words, k0_words, v0_words, n0, end, k_tok, k_slot, v_tok, v_slot, k_strides,
                          v_strides, k0_strides, v0_strides, KEY_BITS, VALUE_BITS, SPLIT), SPLIT)
    return k_loaded, v_loaded, o_loaded


@gluon.jit
def mma_split_kernel(
    q_ptr, k_words_ptr, k_norms_ptr, v_words_ptr, v_norms_ptr, k0_words_ptr, k0_norms_ptr, v0_words_ptr,
    v0_norms_ptr, value_rows_ptr, seq_lens_ptr, part_out_ptr, part_lse_ptr, k_tables, v_tables, pair_table_ptr,
    tokens_per_split, q_strides, k_strides, kn_strides, v_strides, vn_strides, k0_strides, kn0_strides, v0_strides,
    vn0_strides, part_strides, lse_strides, scale_log2,
    GROUP: gl.constexpr, HEADS: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, KEY_BITS: gl.constexpr,
    VALUE_BITS: gl.constexpr, DECODER: gl.constexpr, K_ROW: gl.constexpr, V_ROW: gl.constexpr,
    ROW_LOADS: gl.constexpr,
):
    """One (batch row, KV head, split), one warp. ``q_ptr``: (batch, query heads, 128) fp16 rotated queries in
    :func:`key_channel_order`; ``k_words_ptr`` / ``v_words_ptr``: the packed code rows as int32 words, strides in
    words, ``KEY_BITS`` / ``VALUE_BITS`` their code widths (3 or 4: :func:`~turboquant.kernels._mma.key_slots`), or
    :data:`~turboquant.kernels._mma.SPLIT_43` for both: split streams, ``k_*`` / ``v_*`` then the 3-bit groups and
    ``k0_*`` / ``v0_*`` the 4-bit outlier groups (unread otherwise); ``value_rows_ptr``: :func:`value_channel_order`
    (int32); ``*_tables``: the codebooks' byte tables (4 int32 per codebook, ``_decode.prmt_byte_tables``; the
    outlier codebook's first). Writes the split's normalized output, rotated, and its log2-sum-exp, as
    :func:`.kernel.decode_split_kernel` does. ``STAGES``, the loads' pipeline (Triton does not pipeline loads whose
    consumer is inline assembly, so the kernel does): 1, each tile loaded where it is decoded; 2, the next tile's
    loads issued before this tile is decoded (a register double buffer). ``DECODER``: ``"prmt"``, byte-permute
    lookups in registers (``*_tables``), or ``"lut"`` (4-bit keys and values of one codebook): two codes per load from
    shared-memory copies of ``pair_table_ptr`` (``_decode.pair_lut_table``, 256 int32; unread by ``"prmt"``), a copy
    per two lanes so that at most two lanes' lookups share a bank; ``"lut-keys"`` / ``"lut-values"``: ``"lut"`` for
    that stream, ``"prmt"`` for the other (:func:`stream_decoder`). ``ROW_LOADS`` (one channel group per stream, rows
    aligned for it: :func:`~turboquant.kernels._mma.row_loads_serve`): a tile's code words are loaded by
    :func:`~turboquant.kernels._mma.tile_words`, one address per lane and immediate offsets (``K_ROW`` / ``V_ROW``,
    the words per token row, ``k_strides[2]`` / ``v_strides[2]``), else through per-element pointers."""
    SPLIT: gl.constexpr = KEY_BITS == SPLIT_43
    b = gl.program_id(0).to(gl.int64)
    kv_head = gl.program_id(1)
    split = gl.program_id(2)
    seq_len = gl.load(seq_lens_ptr + b)
    K_DECODER: gl.constexpr = stream_decoder(DECODER, "key")
    V_DECODER: gl.constexpr = stream_decoder(DECODER, "value")
    if K_DECODER == "lut" or V_DECODER == "lut":
        fill_pair_lut(pair_table_ptr)
    start = split * tokens_per_split
    end = gl.minimum(start + tokens_per_split, seq_len)

    KEY_WORDS: gl.constexpr = key_words_layout(BLOCK_N)
    VALUE_WORDS: gl.constexpr = value_words_layout(BLOCK_N, False)
    k_tok = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, KEY_WORDS))
    k_slot = gl.arange(0, 16, layout=gl.SliceLayout(0, KEY_WORDS))
    v_tok = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, VALUE_WORDS))
    v_slot = gl.arange(0, 16, layout=gl.SliceLayout(0, VALUE_WORDS))
    s_tok = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, MMA))
    k_words = k_words_ptr + b * k_strides[0] + kv_head * k_strides[1]
    v_words = v_words_ptr + b * v_strides[0] + kv_head * v_strides[1]
    k_norms = k_norms_ptr + b * kn_strides[0] + kv_head * kn_strides[1]
    v_norms = v_norms_ptr + b * vn_strides[0] + kv_head * vn_strides[1]
    k0_words = k0_words_ptr + b * k0_strides[0] + kv_head * k0_strides[1]
    v0_words = v0_words_ptr + b * v0_strides[0] + kv_head * v0_strides[1]
    k0_norms = k0_norms_ptr + b * kn0_strides[0] + kv_head * kn0_strides[1]
    v0_norms = v0_norms_ptr + b * vn0_strides[0] + kv_head * vn0_strides[1]

    m_i = gl.full((HEADS,), float("-inf"), gl.float32, layout=gl.SliceLayout(0, MMA))
    l_i = gl.zeros((HEADS,), gl.float32, layout=gl.SliceLayout(0, MMA))
    acc = gl.zeros((128, HEADS), gl.float32, layout=MMA)
    acc0 = gl.zeros((SPLIT_OUTLIER_ROWS, HEADS), gl.float32, layout=MMA)  # split: the outlier rows (else unused)
    if STAGES > 1:
        kn, vn, kn0, vn0 = _load_norms(k_norms, v_norms, k0_norms, v0_norms, start, end, s_tok, kn_strides,
                                       vn_strides, kn0_strides, vn0_strides, SPLIT)
    if STAGES == 2:
        k_loaded, v_loaded, o_loaded = _tile_loads(
            k_words, v_words, k0_words, v0_words, start, end, k_tok, k_slot, v_tok, v_slot, k_strides, v_strides,
            k0_strides, v0_strides, BLOCK_N, KEY_BITS, VALUE_BITS, SPLIT, K_ROW, V_ROW, ROW_LOADS)
    k_rows = gl.arange(0, 128, layout=gl.SliceLayout(1, ROWS))
    h_cols = gl.arange(0, HEADS, layout=gl.SliceLayout(0, ROWS))
    q_t = gl.load(q_ptr + b * q_strides[0] + (kv_head * GROUP + h_cols)[None, :] * q_strides[1] + k_rows[:, None],
                  mask=(h_cols < GROUP)[None, :], other=0.0)
    if SPLIT:  # the outlier positions of the key order are k < 32 (turboquant.kernels._mma): their own product
        q0_t = gl.convert_layout(gl.load(q_ptr + b * q_strides[0] + (kv_head * GROUP + h_cols)[None, :] * q_strides[1]
                                         + gl.arange(0, 32, layout=gl.SliceLayout(1, ROWS))[:, None],
                                         mask=(h_cols < GROUP)[None, :], other=0.0), OPERAND_B)
        q_t = gl.where((k_rows < 32)[:, None], 0.0, q_t)
    q_t = gl.convert_layout(q_t, OPERAND_B)

    for n0 in range(start, end, BLOCK_N):
        if STAGES == 1:
            k_loaded, v_loaded, o_loaded = _tile_loads(
                k_words, v_words, k0_words, v0_words, n0, end, k_tok, k_slot, v_tok, v_slot, k_strides, v_strides,
                k0_strides, v0_strides, BLOCK_N, KEY_BITS, VALUE_BITS, SPLIT, K_ROW, V_ROW, ROW_LOADS)
            kn, vn, kn0, vn0 = _load_norms(k_norms, v_norms, k0_norms, v0_norms, n0, end, s_tok, kn_strides,
                                           vn_strides, kn0_strides, vn0_strides, SPLIT)
        if STAGES == 2:  # the next tile's words, issued before this tile's arithmetic (past `end`: masked)
            next_words = _tile_loads(
                k_words, v_words, k0_words, v0_words, n0 + BLOCK_N, end, k_tok, k_slot, v_tok, v_slot, k_strides,
                v_strides, k0_strides, v0_strides, BLOCK_N, KEY_BITS, VALUE_BITS, SPLIT, K_ROW, V_ROW, ROW_LOADS)
        if STAGES > 1:
            next_norms = _load_norms(k_norms, v_norms, k0_norms, v0_norms, n0 + BLOCK_N, end, s_tok, kn_strides,
                                     vn_strides, kn0_strides, vn0_strides, SPLIT)
        kw, vw = _cut_slots(k_loaded, v_loaded, o_loaded, k_slot, v_slot, BLOCK_N, KEY_BITS, VALUE_BITS, SPLIT)
        live = n0 + s_tok < end
        if SPLIT:
            keys, outlier_keys = decoded_split_keys(kw, k_tables, BLOCK_N)
            s = (mma_v2(keys, q_t, gl.zeros((BLOCK_N, HEADS), gl.float32, layout=MMA)) * (kn * scale_log2)[:, None]
                 + mma_v2(outlier_keys, q0_t, gl.zeros((BLOCK_N, HEADS), gl.float32, layout=MMA))
                 * (kn0 * scale_log2)[:, None])
        else:
            keys = decoded_keys(kw, k_tables, BLOCK_N, KEY_BITS, K_DECODER)
            s = mma_v2(keys, q_t, gl.zeros((BLOCK_N, HEADS), gl.float32, layout=MMA)) * (kn * scale_log2)[:, None]
        s = gl.where(live[:, None], s, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, axis=0))
        alpha = gl.exp2(m_i - m_new)
        p = gl.exp2(s - m_new[None, :])
        l_i = l_i * alpha + gl.sum(p, axis=0)
        p_t = gl.convert_layout((p * vn[:, None]).to(gl.float16), OPERAND_B)
        if SPLIT:
            top, values = decoded_split_values(vw, v_tables, BLOCK_N)
            acc = mma_v2(values, p_t, acc * alpha[None, :])
            p0_t = gl.convert_layout((p * vn0[:, None]).to(gl.float16), OPERAND_B)
            acc0 = mma_v2(top, p0_t, acc0 * alpha[None, :])
        else:
            acc = mma_v2(decoded_values(vw, v_tables, BLOCK_N, VALUE_BITS, V_DECODER), p_t, acc * alpha[None, :])
        m_i = m_new
        if STAGES == 2:
            k_loaded, v_loaded, o_loaded = next_words
        if STAGES > 1:
            kn, vn, kn0, vn0 = next_norms

    has_tokens = l_i > 0
    inv_l = 1.0 / gl.where(has_tokens, l_i, 1.0)
    lse = gl.where(has_tokens, m_i + gl.log2(gl.where(has_tokens, l_i, 1.0)), float("-inf"))
    out_rows = gl.arange(0, 128, layout=gl.SliceLayout(1, MMA))
    rows = gl.load(value_rows_ptr + out_rows)
    heads = gl.arange(0, HEADS, layout=gl.SliceLayout(0, MMA))
    live_heads = heads < GROUP
    heads = kv_head * GROUP + heads
    part = part_out_ptr + b * part_strides[0] + heads[None, :] * part_strides[1] + split * part_strides[2]
    if SPLIT:  # the outlier rows (m < 64, m & 8 == 0) are acc0's, the others acc's
        outlier_row = (out_rows < SPLIT_OUTLIER_ROWS) & ((out_rows & 8) == 0)
        gl.store(part + rows[:, None], acc * inv_l[None, :], mask=live_heads[None, :] & ~outlier_row[:, None])
        top = gl.arange(0, SPLIT_OUTLIER_ROWS, layout=gl.SliceLayout(1, MMA))
        top_rows = gl.load(value_rows_ptr + top)
        gl.store(part + top_rows[:, None], acc0 * inv_l[None, :], mask=live_heads[None, :] & ((top & 8) == 0)[:, None])
    else:
        gl.store(part + rows[:, None], acc * inv_l[None, :], mask=live_heads[None, :])
    gl.store(part_lse_ptr + b * lse_strides[0] + heads * lse_strides[1] + split, lse, mask=live_heads)


def _words(codes: torch.Tensor) -> torch.Tensor:
    """uint8 (batch, kv_heads, tokens, row bytes) code rows as int32 words (a view; the rows must be 4-byte
    aligned)."""
    return codes.view(torch.int32)


def _stream_args(groups: Sequence[QuantizedVectors]) -> tuple:
    """The kernel's arguments of one stream: (words, norms) of the group it decodes last (the only group, or the
    3-bit group of a split stream), then of the outlier group (the same tensors again for one group: unread),
    then the four stride tuples in the kernel's order."""
    *outlier, main = groups
    outlier = outlier[0] if outlier else main
    words, outlier_words = _words(main.codes), _words(outlier.codes)
    return ((words, main.norms, outlier_words, outlier.norms),
            (words.stride()[:3], main.norms.stride(), outlier_words.stride()[:3], outlier.norms.stride()))


def mma_split(q_rot: torch.Tensor, keys: Sequence[QuantizedVectors], values: Sequence[QuantizedVectors],
              seq_lens: torch.Tensor, cache_format: CacheFormat, part_out: torch.Tensor, part_lse: torch.Tensor,
              tokens_per_split: int, block_n: int, scale_log2: float, stages: int, decoder: str) -> None:
    """Launch :func:`mma_split_kernel` over ``part_out`` (batch, query heads, splits, 128) / ``part_lse``.
    ``q_rot``: (batch, query heads, 128) fp16 rotated queries in the key order
    (:attr:`CacheFormat.mma_query_map`); ``keys`` / ``values``: each stream's channel groups (outliers first);
    ``stages``, ``decoder``: the kernel's ``STAGES`` and ``DECODER`` (:func:`resolve_mma_decoder`)."""
    batch, n_heads, _ = q_rot.shape
    n_kv_heads, num_splits = keys[0].codes.shape[1], part_out.shape[2]
    (k, kn, k0, kn0), k_strides = _stream_args(keys)
    (v, vn, v0, vn0), v_strides = _stream_args(values)
    key_bits, value_bits = cache_format.mma_bits
    rows_serve = row_loads_serve(k, "key", key_bits) and row_loads_serve(v, "value", value_bits)
    rows = (k_strides[0][2], v_strides[0][2]) if rows_serve else None
    mma_split_kernel[(batch, n_kv_heads, num_splits)](
        q_rot, k, kn, v, vn, k0, kn0, v0, vn0, cache_format.mma_value_rows, seq_lens, part_out, part_lse,
        *cache_format.mma_tables, cache_format.mma_pair_table if decoder.startswith("lut") else seq_lens,
        tokens_per_split, q_rot.stride()[:2], k_strides[0], k_strides[1], v_strides[0], v_strides[1], k_strides[2],
        k_strides[3], v_strides[2], v_strides[3], part_out.stride()[:3], part_lse.stride()[:2], scale_log2,
        **_meta(n_heads // n_kv_heads, block_n, stages, key_bits, value_bits, decoder, rows),
    )


MMA_DECODERS = ("auto", "prmt", "lut", "lut-keys", "lut-values")


@gluon.constexpr_function
def stream_decoder(decoder: str, stream: str) -> str:
    """The decoder of one stream (``"key"`` or ``"value"``) under the kernel's ``DECODER``: ``"lut-keys"`` /
    ``"lut-values"`` take ``"lut"`` for that stream alone and ``"prmt"`` for the other."""
    if decoder in ("lut-keys", "lut-values"):
        return "lut" if decoder == f"lut-{stream}s" else "prmt"
    return decoder


LUT_MIN_TILES = 20  # tiles per split from which "auto" takes the table: it is filled once per program


def resolve_mma_decoder(decoder: str, cache_format: CacheFormat, tiles_per_split: int) -> str:
    """The register-operand kernel's decoder: ``"prmt"`` (byte-permute lookups in registers, every layout the kernel
    reads) or ``"lut"`` (two codes per load from a shared-memory table: 4-bit keys and values of one channel group and
    one codebook, :attr:`CacheFormat.mma_pair_table`), or the table for one stream alone (``"lut-keys"``,
    ``"lut-values"``: :func:`stream_decoder`). ``"auto"`` takes ``"lut-keys"`` where the table serves the
    cache and a split covers at least :data:`LUT_MIN_TILES` tiles (``tiles_per_split``; the table's fill is paid once
    per program, the lookups' saving once per tile: benchmarks/NOTES.md, Sessions 32 and 37; the keys' lookups
    alone, the values' by permutes, were the fastest of the four at the long splits), else ``"prmt"``. ValueError
    naming the reason for a decoder that cannot serve the cache."""
    if decoder not in MMA_DECODERS:
        raise ValueError(f"the register-operand kernel's decoder must be one of {MMA_DECODERS}, got {decoder!r}")
    lut_serves = cache_format.mma_bits == (4, 4) and cache_format.mma_pair_table is not None
    if decoder.startswith("lut") and not lut_serves:
        raise ValueError(f"decoder={decoder!r} reads 4-bit keys and values of one channel group sharing one codebook; "
                         f"this cache is {cache_format.mma_bits} bits, or its streams' codebooks differ")
    if decoder == "auto":
        return "lut-keys" if lut_serves and tiles_per_split >= LUT_MIN_TILES else "prmt"
    return decoder


def _meta(group: int, block_n: int, stages: int, key_bits: int, value_bits: int, decoder: str,
          rows: tuple[int, int] | None) -> dict:
    """The kernel's compile-time arguments; ``rows``: the key and value words per token row where the row loads serve
    (``ROW_LOADS``), None where they do not (``K_ROW`` / ``V_ROW`` then 0, unread: one compile whatever the strides)."""
    if stages not in (1, 2):
        raise ValueError(f"the register-operand kernel pipelines 1 or 2 stages through registers; got "
                         f"num_stages={stages}")
    key_row, value_row = rows or (0, 0)
    return dict(GROUP=group, HEADS=8 if group <= 8 else 16, BLOCK_N=block_n, STAGES=stages, KEY_BITS=key_bits,
                VALUE_BITS=value_bits, DECODER=decoder, K_ROW=key_row, V_ROW=value_row, ROW_LOADS=rows is not None,
                num_warps=1)


MAX_BLOCKS_PER_SM = 32  # resident thread blocks per SM on sm_80 - sm_90


@functools.cache
def resident_programs(device_index: int, group: int, block_n: int, stages: int, bits: tuple[int, int],
                      decoder: str = "prmt") -> int:
    """One-warp programs of :func:`mma_split_kernel` that fit on one SM at once: the SM's registers over the
    kernel's (compiled once, fp16 norms; ptxas allocates registers per warp in units of 256) and its shared memory
    over the kernel's (Triton's and the ``"lut"`` decoder's static table: :func:`blocks_fitting_shared_memory`), at
    most :data:`MAX_BLOCKS_PER_SM`."""
    from triton.runtime.jit import MockTensor

    i32, f16, f32 = (MockTensor(t) for t in (torch.int32, torch.float16, torch.float32))
    words, norms = (1 << 20, 1 << 16, 16), (1 << 16, 1 << 12, 1)  # the specializations of a contiguous cache
    tables = (3,) * (8 if bits[0] == SPLIT_BITS else 4)
    with torch.cuda.device(device_index):
        compiled = mma_split_kernel.warmup(
            f16, i32, f16, i32, f16, i32, f16, i32, f16, i32, i32, f32, f32, tables, tables, i32, 1024,
            (4096, 128), words, norms, words, norms, words, norms, words, norms, words, (4096, 64), 1.0, grid=(1,),
            **_meta(group, block_n, stages, *bits, decoder, (words[2], words[2])))
        compiled._init_handles()  # loads the binary, which is when Triton reads its register count
    props = torch.cuda.get_device_properties(device_index)
    registers_per_warp = -(-compiled.n_regs * 32 // 256) * 256
    shared = compiled.metadata.shared + (PAIR_LUT_BYTES if decoder.startswith("lut") else 0)
    return max(1, min(MAX_BLOCKS_PER_SM, props.max_threads_per_multi_processor // 32,
                      props.regs_per_multiprocessor // registers_per_warp,
                      blocks_fitting_shared_memory(torch.device("cuda", device_index), shared)))


MIN_SPLIT_TILES = 4  # a program's prologue and its split's share of the merge outweigh a fuller wave below this


def default_mma_splits(batch: int, n_kv_heads: int, max_tokens: int, device: torch.device, block_n: int,
                       group: int, stages: int, bits: tuple[int, int] = (4, 4), decoder: str = "prmt") -> int:
    """Splits so that the grid is one wave of resident programs (:func:`resident_programs` on every SM: a partial
    second wave would leave most SMs idle at its end), at least :data:`MIN_SPLIT_TILES` tiles per split."""
    if device.type != "cuda":
        return 1
    index = device.index if device.index is not None else torch.cuda.current_device()
    wave = resident_programs(index, group, block_n, stages, bits, decoder) * torch.cuda.get_device_properties(
        index).multi_processor_count
    return max(1, min(wave // (batch * n_kv_heads), triton.cdiv(max_tokens, MIN_SPLIT_TILES * block_n)))
