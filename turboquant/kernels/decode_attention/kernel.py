"""The two Triton kernels of split-KV decode attention over a packed cache (the math: the package docstring).

Kernel 1 (:func:`decode_split_kernel`): one program per (batch row, KV head, KV split) covering the whole GQA
group of query heads, so each cache byte is read once. It walks its token range in tiles, decodes codes to fp16
centroid values in registers (QJL sign bits to +-1 without a table), computes each stage's logits and ``P V`` with
an online softmax, and writes the split's normalized output (rotated, groups concatenated) and log-sum-exp. The
second channel group and the QJL stages are ``tl.constexpr`` flags: a one-group TurboQuant_mse cache compiles to
the one-stage kernel. Two more constexprs choose the inner loop: ``DECODE`` the code decoder (``_decode``: table
gather, register codebook by selects, or inline-PTX ``prmt`` for 3- and 4-bit codes) and ``INNER`` the multiply:
``"dot"`` (``tl.dot`` on the tensor cores, fp16 operands, fp32 accumulation) or ``"fma"`` (CUDA-core FMAs in fp32,
a broadcast multiply and ``tl.sum``, so the decoded tile is never staged through shared memory for an MMA; decode is
a matrix-vector product per query head, worth it for small GQA groups).

Kernels 2 and 3: :func:`merge_kernel`, one program per (batch row, KV head, slice of rotated channels), merges the
splits of its GQA group by their log-sum-exp in one pass; :func:`rotate_kernel`, one program per (batch row, KV head,
slice of output channels), applies the block-diagonal ``Pi_V^T``, writing the output in the query's dtype, scattered
through ``perm_V`` when values are split. Each grid has several programs per (row, KV head): at small batch a program
per (row, KV head) leaves most SMs idle while it walks the splits. The same :func:`rotate_kernel` prepares the query
before kernel 1 (gathered into the key order, times the query map, fp16), one launch where a cast, a gather, a
matmul and a cast were four.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .._decode import (CHANNEL_ORDER_MIN_TOKENS, channel_order_tile, code_values, nibble_pair_values,
                      three_bit_group_values)
from .._layout import load_group_words, stream_coordinates, words_to_stream_codes


@triton.jit
def _code_values(words, shift, table_ptr, BITS: tl.constexpr, SIGNS: tl.constexpr, DECODE: tl.constexpr):
    """fp16 values of the ``BITS``-bit codes at bit ``shift`` of ``words``: the codebook's (``_decode``), or -1 / +1
    for QJL sign bits (``SIGNS``, no table)."""
    if SIGNS:
        values = (((words >> shift) & 1) * 2 - 1).to(tl.float16)
    else:
        values = code_values(words, shift, table_ptr, BITS, DECODE)
    return values


@triton.jit
def _matmul(a, b, acc, INNER: tl.constexpr):
    """``acc + a @ b`` in fp32 (a: (M, K), b: (K, N)): ``tl.dot`` with fp16 operands, or CUDA-core FMAs."""
    if INNER == "dot":
        out = tl.dot(a.to(tl.float16), b.to(tl.float16), acc)
    else:
        out = acc + tl.sum(a.to(tl.float32)[:, :, None] * b.to(tl.float32)[None, :, :], axis=1)
    return out


@triton.jit
def _weighted_sum(p, values, acc, INNER: tl.constexpr):
    """``acc + p^T @ values`` in fp32 (p: (tokens, heads), values: (tokens, channels)): ``P V`` of one tile."""
    if INNER == "dot":
        out = tl.dot(tl.trans(p.to(tl.float16)), values, acc)
    else:
        out = acc + tl.sum(p[:, :, None] * values.to(tl.float32)[:, None, :], axis=0)
    return out


@triton.jit
def _stage_scores(rows, tok_mask, row_bytes, q_cols, head_mask, table_ptr,
                  BITS: tl.constexpr, BPG: tl.constexpr, CPG: tl.constexpr, GROUPS: tl.constexpr,
                  BLOCK_M: tl.constexpr, SIGNS: tl.constexpr, DECODE: tl.constexpr, INNER: tl.constexpr,
                  WHOLE_GROUPS: tl.constexpr):
    """(tokens, heads) fp32 ``<q_stage, table[code]>`` for the packed rows at ``rows``; ``q_cols`` points at the
    stage's query in stream order (position ``k * GROUPS + g`` = code k of group g).

    With at least 16 code groups: one product per code position k (K = GROUPS); 4-bit codes decode both positions
    of a byte at once (:func:`nibble_pair_values`), 3-bit codes all 8 of a group at once in channel order where
    ``WHOLE_GROUPS`` (the tile rule, :func:`decode_split_kernel`). A smaller stage (the outlier group: 32 channels
    of 3-bit codes or of sign bits are 4 groups) packs ``16 // GROUPS`` code positions into the 16 columns a
    ``tl.dot`` needs (column c: position k0 + c // GROUPS of group c % GROUPS, the same stream order), rather than
    padding every position to 16 groups."""
    acc = tl.zeros((rows.shape[0], BLOCK_M), dtype=tl.float32)
    if GROUPS >= 16:
        g_offs = tl.arange(0, GROUPS)
        CHANNEL_ORDER: tl.constexpr = BITS == 3 and WHOLE_GROUPS
        words = load_group_words(rows, tok_mask, g_offs, row_bytes, BPG, CHANNEL_ORDER)
        if CPG == 2 and not SIGNS:
            even, odd = nibble_pair_values(words, table_ptr, DECODE)
            q_even = tl.load(q_cols + g_offs[:, None], mask=head_mask[None, :], other=0.0)
            q_odd = tl.load(q_cols + (GROUPS + g_offs)[:, None], mask=head_mask[None, :], other=0.0)
            acc = _matmul(odd, q_odd, _matmul(even, q_even, acc, INNER), INNER)
        elif CHANNEL_ORDER:  # the 8 codes of a group word decoded at once, one product in channel order
            keys = channel_order_tile(three_bit_group_values(words, table_ptr, DECODE))
            c = tl.arange(0, 8 * GROUPS)
            q_t = tl.load(q_cols + ((c % 8) * GROUPS + c // 8)[:, None], mask=head_mask[None, :], other=0.0)
            acc = _matmul(keys, q_t, acc, INNER)
        else:
            for k in tl.static_range(CPG):
                q_t = tl.load(q_cols + (k * GROUPS + g_offs)[:, None], mask=head_mask[None, :], other=0.0)
                acc = _matmul(_code_values(words, BITS * k, table_ptr, BITS, SIGNS, DECODE), q_t, acc, INNER)
    else:
        cols = tl.arange(0, 16)
        words = load_group_words(rows, tok_mask, cols % GROUPS, row_bytes, BPG)
        for k0 in tl.static_range(0, CPG, 16 // GROUPS):
            position = k0 + cols // GROUPS
            live = position < CPG  # past the last code position when CPG * GROUPS < 16
            q_t = tl.load(q_cols + (k0 * GROUPS + cols)[:, None], mask=head_mask[None, :] & live[:, None],
                          other=0.0)
            shift = (BITS * tl.where(live, position, 0))[None, :]
            acc = _matmul(_code_values(words, shift, table_ptr, BITS, SIGNS, DECODE), q_t, acc, INNER)
    return acc


@triton.jit
def _head_start(field, b, kv_head):
    """Pointer to (row ``b``, KV head ``kv_head``, token 0) of a strided field ``(ptr, stride_b, stride_h, ...)``."""
    return field[0] + (b * field[1] + kv_head * field[2])


@triton.jit
def _key_group_starts(group, b, kv_head):
    """(codes, norms, signs, residual norms) pointers of one key group at (row, KV head), token 0."""
    return (_head_start(group[0], b, kv_head), _head_start(group[1], b, kv_head), _head_start(group[2], b, kv_head),
            _head_start(group[3], b, kv_head))


@triton.jit
def _value_group_starts(group, b, kv_head):
    """(codes, norms) pointers of one value group at (row, KV head), token 0."""
    return _head_start(group[0], b, kv_head), _head_start(group[1], b, kv_head)


@triton.jit
def _key_group_logits(starts, group, toks, tok_mask, q_cols, head_mask, scale, GEOMETRY: tl.constexpr,
                      BLOCK_M: tl.constexpr, DECODE: tl.constexpr, INNER: tl.constexpr, WHOLE_GROUPS: tl.constexpr):
    """One key group's share of the tile's logits, (tokens, heads) fp32:
    ``scale * n_t * (<Pi q_g, c[idx_t]> + rho_t <gamma S q_g, z_t>)`` (the QJL term only with ``QJL``).
    ``starts``: :func:`_key_group_starts`; ``group``: the group's kernel argument (``launch._key_group_args``);
    ``GEOMETRY``: its ``format.KeyGeometry``."""
    BITS: tl.constexpr = GEOMETRY[0]
    BPG: tl.constexpr = GEOMETRY[1]
    CPG: tl.constexpr = GEOMETRY[2]
    GROUPS: tl.constexpr = GEOMETRY[3]
    QJL: tl.constexpr = GEOMETRY[4]
    SIGN_GROUPS: tl.constexpr = GEOMETRY[5]
    Q_OFF: tl.constexpr = GEOMETRY[6]
    QJL_Q_OFF: tl.constexpr = GEOMETRY[7]
    codes, norms, signs, residual_norms = starts
    table, code_bytes, sign_bytes = group[4], group[5], group[6]
    stride_cn, stride_sn = group[0][3], group[2][3]
    rows = toks.to(tl.int64)
    if BITS > 0:
        unit = _stage_scores(codes + rows * stride_cn, tok_mask, code_bytes, q_cols + Q_OFF, head_mask, table,
                             BITS, BPG, CPG, GROUPS, BLOCK_M, False, DECODE, INNER, WHOLE_GROUPS)
    else:
        unit = tl.zeros((toks.shape[0], BLOCK_M), dtype=tl.float32)
    if QJL:
        rho = tl.load(residual_norms + toks, mask=tok_mask, other=0.0).to(tl.float32)
        unit += rho[:, None] * _stage_scores(signs + rows * stride_sn, tok_mask, sign_bytes, q_cols + QJL_Q_OFF,
                                             head_mask, table, 1, 1, 8, SIGN_GROUPS, BLOCK_M, True, DECODE,
                                             INNER, WHOLE_GROUPS)
    norm = tl.load(norms + toks, mask=tok_mask, other=0.0).to(tl.float32)
    return unit * (norm * scale)[:, None]


@triton.jit
def _value_accumulators(BLOCK_M: tl.constexpr, GEOMETRY: tl.constexpr):
    """Zero accumulators of one value group: 4-bit values keep even and odd coordinates apart ((heads, groups)
    each); other widths one (heads, CPG * groups) tile (3-bit groups in channel order where ``WHOLE_GROUPS``, else
    in stream order) and an unused (heads, 1) placeholder."""
    CPG: tl.constexpr = GEOMETRY[2]
    GROUPS: tl.constexpr = GEOMETRY[3]
    if CPG == 2:
        acc_a = tl.zeros((BLOCK_M, GROUPS), dtype=tl.float32)
        acc_b = tl.zeros((BLOCK_M, GROUPS), dtype=tl.float32)
    else:
        acc_a = tl.zeros((BLOCK_M, CPG * GROUPS), dtype=tl.float32)
        acc_b = tl.zeros((BLOCK_M, 1), dtype=tl.float32)
    return acc_a, acc_b


@triton.jit
def _accumulate_values(acc_a, acc_b, p, alpha, starts, group, toks, tok_mask, GEOMETRY: tl.constexpr,
                       DECODE: tl.constexpr, INNER: tl.constexpr, WHOLE_GROUPS: tl.constexpr):
    """``acc <- alpha * acc + sum_t p_t n_t c[idx_t]`` for one value group over the tile (its rotated domain);
    ``starts``: :func:`_value_group_starts`, ``group``: ``launch._value_group_args``, ``GEOMETRY``: its
    ``format.ValueGeometry``."""
    BITS: tl.constexpr = GEOMETRY[0]
    BPG: tl.constexpr = GEOMETRY[1]
    CPG: tl.constexpr = GEOMETRY[2]
    GROUPS: tl.constexpr = GEOMETRY[3]
    codes, norms = starts
    table, code_bytes, stride_cn = group[2], group[3], group[0][3]
    norm = tl.load(norms + toks, mask=tok_mask, other=0.0).to(tl.float32)
    p_n = p * norm[:, None]
    CHANNEL_ORDER: tl.constexpr = BITS == 3 and WHOLE_GROUPS
    words = load_group_words(codes + toks.to(tl.int64) * stride_cn, tok_mask, tl.arange(0, GROUPS), code_bytes, BPG,
                             CHANNEL_ORDER)
    if CPG == 2:
        even, odd = nibble_pair_values(words, table, DECODE)
        acc_a = _weighted_sum(p_n, even, acc_a * alpha[:, None], INNER)
        acc_b = _weighted_sum(p_n, odd, acc_b * alpha[:, None], INNER)
    elif CHANNEL_ORDER:
        tile = channel_order_tile(three_bit_group_values(words, table, DECODE))
        acc_a = _weighted_sum(p_n, tile, acc_a * alpha[:, None], INNER)
    else:
        stream = words_to_stream_codes(words, BITS, CPG)
        acc_a = _weighted_sum(p_n, code_values(stream, 0, table, BITS, DECODE), acc_a * alpha[:, None], INNER)
    return acc_a, acc_b


@triton.jit
def _store_values(part, acc_a, acc_b, inv_l, head_mask, GEOMETRY: tl.constexpr, WHOLE_GROUPS: tl.constexpr):
    """Write one value group's normalized accumulator to its channels ``OFF .. OFF + DIM - 1`` of the split's row."""
    BITS: tl.constexpr = GEOMETRY[0]
    CPG: tl.constexpr = GEOMETRY[2]
    GROUPS: tl.constexpr = GEOMETRY[3]
    DIM: tl.constexpr = GEOMETRY[4]
    OFF: tl.constexpr = GEOMETRY[5]
    g_offs = tl.arange(0, GROUPS)
    if CPG == 2:
        even = 2 * g_offs
        tl.store(part + OFF + even[None, :], acc_a * inv_l[:, None], mask=head_mask[:, None] & (even < DIM)[None, :])
        tl.store(part + OFF + even[None, :] + 1, acc_b * inv_l[:, None],
                 mask=head_mask[:, None] & (even + 1 < DIM)[None, :])
    else:
        CHANNEL_ORDER: tl.constexpr = BITS == 3 and WHOLE_GROUPS
        coords = tl.arange(0, CPG * GROUPS) if CHANNEL_ORDER else stream_coordinates(g_offs, CPG)
        tl.store(part + OFF + coords[None, :], acc_a * inv_l[:, None],
                 mask=head_mask[:, None] & (coords < DIM)[None, :])


@triton.jit
def decode_split_kernel(
    q_ptr, seq_lens_ptr, part_out_ptr, part_lse_ptr, k0, k1, v0, v1,
    tokens_per_split, q_strides, part_strides, lse_strides, scale_log2,
    GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DECODE: tl.constexpr, INNER: tl.constexpr,
    K_SPLIT: tl.constexpr, V_SPLIT: tl.constexpr,
    K0: tl.constexpr, K1: tl.constexpr, V0: tl.constexpr, V1: tl.constexpr,
):
    """One (batch row, KV head, split). Logits are kept transposed, (tokens, heads), so decoded keys are the
    A operand of the product; ``q_ptr`` holds every key stage's query in stream order (:attr:`CacheFormat.query_map`).
    ``k{g}`` / ``v{g}`` are key / value channel group g as tuples of its strided fields and sizes
    (``launch._key_group_args`` / ``_value_group_args``), ``K{g}`` / ``V{g}`` its compile-time geometry
    (``format.KeyGeometry`` / ``ValueGeometry``); group 1 and the QJL stages are read only under their flags."""
    b = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + b)
    start = split * tokens_per_split
    end = tl.minimum(start + tokens_per_split, seq_len)

    head_offs = tl.arange(0, BLOCK_M)
    head_mask = head_offs < GROUP
    heads = kv_head * GROUP + head_offs
    q_cols = q_ptr + b * q_strides[0] + heads[None, :] * q_strides[1]

    k0_starts = _key_group_starts(k0, b, kv_head)
    k1_starts = _key_group_starts(k1, b, kv_head)
    v0_starts = _value_group_starts(v0, b, kv_head)
    v1_starts = _value_group_starts(v1, b, kv_head)

    # 3-bit groups decode whole, in channel order, only in tiles of CHANNEL_ORDER_MIN_TOKENS tokens or more
    WHOLE_GROUPS: tl.constexpr = BLOCK_N >= CHANNEL_ORDER_MIN_TOKENS
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc0_a, acc0_b = _value_accumulators(BLOCK_M, V0)
    if V_SPLIT:
        acc1_a, acc1_b = _value_accumulators(BLOCK_M, V1)
    for n0 in range(start, end, BLOCK_N):
        toks = n0 + tl.arange(0, BLOCK_N)
        tok_mask = toks < end
        logits = _key_group_logits(k0_starts, k0, toks, tok_mask, q_cols, head_mask, scale_log2, K0, BLOCK_M, DECODE,
                                   INNER, WHOLE_GROUPS)
        if K_SPLIT:
            logits += _key_group_logits(k1_starts, k1, toks, tok_mask, q_cols, head_mask, scale_log2, K1, BLOCK_M,
                                        DECODE, INNER, WHOLE_GROUPS)
        logits = tl.where(tok_mask[:, None], logits, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(logits, axis=0))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(logits - m_new[None, :])
        l_i = l_i * alpha + tl.sum(p, axis=0)
        acc0_a, acc0_b = _accumulate_values(acc0_a, acc0_b, p, alpha, v0_starts, v0, toks, tok_mask, V0, DECODE,
                                            INNER, WHOLE_GROUPS)
        if V_SPLIT:
            acc1_a, acc1_b = _accumulate_values(acc1_a, acc1_b, p, alpha, v1_starts, v1, toks, tok_mask, V1,
                                                DECODE, INNER, WHOLE_GROUPS)
        m_i = m_new

    has_tokens = l_i > 0
    inv_l = 1.0 / tl.where(has_tokens, l_i, 1.0)
    lse = tl.where(has_tokens, m_i + tl.log2(tl.where(has_tokens, l_i, 1.0)), float("-inf"))
    part = part_out_ptr + b * part_strides[0] + heads[:, None] * part_strides[1] + split * part_strides[2]
    _store_values(part, acc0_a, acc0_b, inv_l, head_mask, V0, WHOLE_GROUPS)
    if V_SPLIT:
        _store_values(part, acc1_a, acc1_b, inv_l, head_mask, V1, WHOLE_GROUPS)
    tl.store(part_lse_ptr + b * lse_strides[0] + heads * lse_strides[1] + split, lse, mask=head_mask)


@triton.jit
def merge_kernel(
    part_out_ptr, part_lse_ptr, o_rot_ptr, lse_ptr, n_splits, dim,
    stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_rb, stride_rh, stride_eb,
    GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_S: tl.constexpr, SLICE: tl.constexpr, WRITE_LSE: tl.constexpr,
):
    """Merge the splits of (batch row, KV head) for its GQA group of query heads and channels ``program_id(2) * SLICE``
    onward of the rotated output, in one pass over the splits (``BLOCK_S`` at a time, a running maximum of their
    log2-sum-exps as in the split kernel's softmax): ``o_rot = sum_s 2^(lse_s - M) o_s / sum_s 2^(lse_s - M)``. With
    WRITE_LSE (slice 0) also store the natural log-sum-exp of the scaled logits over all splits (-inf for none)."""
    b = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    rows = tl.arange(0, BLOCK_M)
    row_mask = rows < GROUP
    heads = kv_head * GROUP + rows
    channels = tl.program_id(2) * SLICE + tl.arange(0, SLICE)
    c_mask = channels < dim
    s_offs = tl.arange(0, BLOCK_S)
    lse_rows = part_lse_ptr + b * stride_lb + heads[:, None] * stride_lh
    part_rows = part_out_ptr + b * stride_pb + heads[:, None, None] * stride_ph + channels[None, None, :]
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, SLICE), dtype=tl.float32)
    for s0 in range(0, n_splits, BLOCK_S):
        splits = s0 + s_offs
        lse = tl.load(lse_rows + splits[None, :], mask=row_mask[:, None] & (splits < n_splits)[None, :],
                      other=float("-inf"))
        m_new = tl.maximum(m_i, tl.max(lse, axis=1))
        shift = tl.where(m_new > float("-inf"), m_new, 0.0)
        alpha = tl.exp2(m_i - shift)
        weight = tl.exp2(lse - shift[:, None])
        part = tl.load(part_rows + splits[None, :, None] * stride_ps,
                       mask=(weight > 0)[:, :, None] & c_mask[None, None, :], other=0.0)
        acc = acc * alpha[:, None] + tl.sum(weight[:, :, None] * part, axis=1)
        l_i = l_i * alpha + tl.sum(weight, axis=1)
        m_i = m_new
    o_rot = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(o_rot_ptr + b * stride_rb + heads[:, None] * stride_rh + channels[None, :], o_rot,
             mask=row_mask[:, None] & c_mask[None, :])
    if WRITE_LSE:
        if tl.program_id(2) == 0:
            lse2 = tl.where(l_i > 0, m_i + tl.log2(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))
            tl.store(lse_ptr + b * stride_eb + heads, lse2 * 0.6931471805599453, mask=row_mask)


@triton.jit
def rotate_kernel(
    x_ptr, mat_ptr, perm_ptr, out_ptr, dim, cols,
    stride_xb, stride_xh, stride_ad, stride_aj, stride_ob, stride_oh, stride_mb, stride_mh,
    GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_J: tl.constexpr, PERMUTE: tl.constexpr,
):
    """Output columns ``program_id(2) * BLOCK_J`` onward of the GQA group of (batch row, KV head):
    ``out = x @ mat`` for the group's rows of ``x`` (any float dtype, summed in float32; ``mat`` (dim, cols) float32,
    strides ``stride_ad``, ``stride_aj``), written in the output's dtype. ``PERMUTE``: ``"none"``; ``"input"``: x's
    columns gathered through the (batch row, KV head)'s channel order, ``x_P[d] = x[perm[d]]`` (the query in a split
    cache's key order); ``"output"``: the output scattered through it, ``out[perm[j]] = o[j]`` (the merged output
    back in the model's value order)."""
    b = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    rows = tl.arange(0, BLOCK_M)
    row_mask = rows < GROUP
    heads = kv_head * GROUP + rows
    d_offs = tl.arange(0, BLOCK_D)
    d_mask = d_offs < dim
    j_offs = tl.program_id(2) * BLOCK_J + tl.arange(0, BLOCK_J)
    j_mask = j_offs < cols
    perm_row = perm_ptr + b * stride_mb + kv_head * stride_mh
    if PERMUTE == "input":
        x_cols = tl.load(perm_row + d_offs, mask=d_mask, other=0)
    else:
        x_cols = d_offs
    x = tl.load(x_ptr + b * stride_xb + heads[:, None] * stride_xh + x_cols[None, :],
                mask=row_mask[:, None] & d_mask[None, :], other=0.0).to(tl.float32)
    mat = tl.load(mat_ptr + d_offs[:, None] * stride_ad + j_offs[None, :] * stride_aj,
                  mask=d_mask[:, None] & j_mask[None, :], other=0.0)
    o = tl.sum(x[:, :, None] * mat[None, :, :], axis=1)
    if PERMUTE == "output":
        out_cols = tl.load(perm_row + j_offs, mask=j_mask, other=0)
    else:
        out_cols = j_offs
    tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + out_cols[None, :], o.to(out_ptr.dtype.element_ty),
             mask=row_mask[:, None] & j_mask[None, :])
