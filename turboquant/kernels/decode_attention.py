"""Flash-decoding attention for one new token per sequence over a TurboQuant_mse-packed K and V cache.

Cache (per batch row b, KV head h, token t): key codes/norm ``(idx^K, n^K)`` and value codes/norm
``(idx^V, n^V)`` from Algorithm 1, so ``k~ = n^K Pi_K^T c_K[idx^K]`` and ``v~ = n^V Pi_V^T c_V[idx^V]``.
With ``q_rot = Pi_K q`` (rotated once, outside the kernel):

    s_t = scale * n^K_t * <q_rot, c_K[idx^K_t]>,
    o   = sum_t softmax(s)_t v~_t = Pi_V^T ( sum_t softmax(s)_t n^V_t c_V[idx^V_t] ),

i.e. values are accumulated in the rotated domain and rotated back once, on the (head_dim,) output.

Kernel 1 (split): one program per (batch row, KV head, KV split) covering the whole GQA group of query
heads, so each cache byte is read once. It walks its token range in tiles, decodes codes to fp16
centroid values in registers, computes the logits and ``P V`` with ``tl.dot`` (fp32 accumulation) and
an online softmax, and writes the split's normalized output and log-sum-exp.
Kernel 2 (combine): one program per (batch row, block of query heads) merges the splits by their
log-sum-exp and applies ``Pi_V^T`` (a small matmul), writing the output in the query's dtype.

Sequence lengths may differ within the batch (``seq_lens``); tokens at or past a row's length are
never read. No causal mask is needed: the new token attends to every cached token.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ._layout import (
    check_device,
    group_geometry,
    load_group_words,
    num_groups,
    packed_row_bytes,
    pow2_at_least,
    stream_coordinates,
    words_to_stream_codes,
)
from .scores import decode_codes, stream_queries


@triton.jit
def _decode_split_kernel(
    q_ptr, k_codes_ptr, k_norms_ptr, v_codes_ptr, v_norms_ptr, seq_lens_ptr, k_cent_ptr, v_cent_ptr,
    part_out_ptr, part_lse_ptr,
    dim, k_row_bytes, v_row_bytes, tokens_per_split,
    stride_qb, stride_qh,
    stride_kcb, stride_kch, stride_kcn, stride_knb, stride_knh,
    stride_vcb, stride_vch, stride_vcn, stride_vnb, stride_vnh,
    stride_pb, stride_ph, stride_ps, stride_lb, stride_lh,
    scale_log2,
    GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    K_BITS: tl.constexpr, K_BPG: tl.constexpr, K_CPG: tl.constexpr, K_GROUPS: tl.constexpr,
    V_BITS: tl.constexpr, V_BPG: tl.constexpr, V_CPG: tl.constexpr, V_GROUPS: tl.constexpr, LOOKUP: tl.constexpr,
):
    """One (batch row, KV head, split). Logits are kept transposed, (tokens, heads), so decoded keys
    are the A operand of tl.dot; ``q_ptr`` is the rotated query in stream order (``stream_queries``).
    Values: 4-bit (two codes per byte) accumulate the even and odd coordinates separately; other
    widths decode a full value tile in stream order (``words_to_stream_codes``)."""
    b = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + b)
    start = split * tokens_per_split
    end = tl.minimum(start + tokens_per_split, seq_len)

    head_offs = tl.arange(0, BLOCK_M)
    head_mask = head_offs < GROUP
    heads = kv_head * GROUP + head_offs
    k_groups = tl.arange(0, K_GROUPS)
    q_cols = q_ptr + b * stride_qb + heads[None, :] * stride_qh
    v_groups = tl.arange(0, V_GROUPS)

    k_codes = k_codes_ptr + b * stride_kcb + kv_head * stride_kch
    k_norms = k_norms_ptr + b * stride_knb + kv_head * stride_knh
    v_codes = v_codes_ptr + b * stride_vcb + kv_head * stride_vch
    v_norms = v_norms_ptr + b * stride_vnb + kv_head * stride_vnh

    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    if V_CPG == 2:
        acc_even = tl.zeros((BLOCK_M, V_GROUPS), dtype=tl.float32)
        acc_odd = tl.zeros((BLOCK_M, V_GROUPS), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, V_CPG * V_GROUPS), dtype=tl.float32)
    for n0 in range(start, end, BLOCK_N):
        toks = n0 + tl.arange(0, BLOCK_N)
        tok_mask = toks < end
        k_words = load_group_words(k_codes + toks.to(tl.int64) * stride_kcn, tok_mask, k_groups, k_row_bytes, K_BPG)
        logits = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        for k in tl.static_range(K_CPG):
            q_t = tl.load(q_cols + (k * K_GROUPS + k_groups)[:, None], mask=head_mask[None, :], other=0.0)
            logits = tl.dot(decode_codes(k_words, k_cent_ptr, k, K_BITS, LOOKUP), q_t, logits)
        k_norm = tl.load(k_norms + toks, mask=tok_mask, other=0.0).to(tl.float32)
        logits = logits * (k_norm * scale_log2)[:, None]
        logits = tl.where(tok_mask[:, None], logits, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(logits, axis=0))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(logits - m_new[None, :])
        l_i = l_i * alpha + tl.sum(p, axis=0)
        v_norm = tl.load(v_norms + toks, mask=tok_mask, other=0.0).to(tl.float32)
        p_t = tl.trans((p * v_norm[:, None]).to(tl.float16))
        v_rows = v_codes + toks.to(tl.int64) * stride_vcn
        v_words = load_group_words(v_rows, tok_mask, v_groups, v_row_bytes, V_BPG)
        if V_CPG == 2:
            acc_even = tl.dot(p_t, decode_codes(v_words, v_cent_ptr, 0, V_BITS, LOOKUP), acc_even * alpha[:, None])
            acc_odd = tl.dot(p_t, decode_codes(v_words, v_cent_ptr, 1, V_BITS, LOOKUP), acc_odd * alpha[:, None])
        else:
            v_stream = words_to_stream_codes(v_words, V_BITS, V_CPG)
            if LOOKUP:
                values = tl.load(v_cent_ptr + v_stream)
            else:
                values = v_stream.to(tl.float16)
            acc = tl.dot(p_t, values, acc * alpha[:, None])
        m_i = m_new

    has_tokens = l_i > 0
    inv_l = 1.0 / tl.where(has_tokens, l_i, 1.0)
    lse = tl.where(has_tokens, m_i + tl.log2(tl.where(has_tokens, l_i, 1.0)), float("-inf"))
    part = part_out_ptr + b * stride_pb + heads[:, None] * stride_ph + split * stride_ps
    if V_CPG == 2:
        even = 2 * v_groups
        tl.store(part + even[None, :], acc_even * inv_l[:, None], mask=head_mask[:, None] & (even < dim)[None, :])
        tl.store(part + even[None, :] + 1, acc_odd * inv_l[:, None],
                 mask=head_mask[:, None] & (even + 1 < dim)[None, :])
    else:
        v_coords = stream_coordinates(v_groups, V_CPG)
        tl.store(part + v_coords[None, :], acc * inv_l[:, None], mask=head_mask[:, None] & (v_coords < dim)[None, :])
    tl.store(part_lse_ptr + b * stride_lb + heads * stride_lh + split, lse, mask=head_mask)


@triton.jit
def _combine_kernel(
    part_out_ptr, part_lse_ptr, rot_ptr, out_ptr, lse_ptr,
    n_heads, n_splits, dim,
    stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_ob, stride_oh, stride_eb,
    BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_J: tl.constexpr, WRITE_LSE: tl.constexpr,
):
    """Merge the splits of (batch row, block of heads) by their log-sum-exp, rotate back with Pi_V^T; with
    WRITE_LSE also store the natural log-sum-exp of the scaled logits over all splits (-inf for no tokens)."""
    b = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    head_mask = heads < n_heads
    d_offs = tl.arange(0, BLOCK_D)
    d_mask = d_offs < dim
    lse_rows = part_lse_ptr + b * stride_lb + heads * stride_lh
    lse_max = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    for s in range(n_splits):
        lse_max = tl.maximum(lse_max, tl.load(lse_rows + s, mask=head_mask, other=float("-inf")))
    finite = lse_max > float("-inf")
    shift = tl.where(finite, lse_max, 0.0)
    total = tl.zeros((BLOCK_M,), dtype=tl.float32)
    o_rot = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    for s in range(n_splits):
        weight = tl.exp2(tl.load(lse_rows + s, mask=head_mask, other=float("-inf")) - shift)
        part = tl.load(part_out_ptr + b * stride_pb + heads[:, None] * stride_ph + s * stride_ps + d_offs[None, :],
                       mask=(head_mask[:, None] & d_mask[None, :]) & (weight > 0)[:, None], other=0.0)
        o_rot += weight[:, None] * part
        total += weight
    o_rot = o_rot / tl.where(total > 0, total, 1.0)[:, None]
    if WRITE_LSE:
        lse2 = tl.where(total > 0, shift + tl.log2(tl.where(total > 0, total, 1.0)), float("-inf"))
        tl.store(lse_ptr + b * stride_eb + heads, lse2 * 0.6931471805599453, mask=head_mask)
    for j0 in range(0, dim, BLOCK_J):
        j_offs = j0 + tl.arange(0, BLOCK_J)
        rot = tl.load(rot_ptr + d_offs[:, None] * dim + j_offs[None, :],
                      mask=d_mask[:, None] & (j_offs < dim)[None, :], other=0.0)
        o = tl.dot(o_rot, rot)
        tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + j_offs[None, :],
                 o.to(out_ptr.dtype.element_ty), mask=head_mask[:, None] & (j_offs < dim)[None, :])


def _check(q, k_codes, k_norms, v_codes, v_norms, seq_lens, k_bits, v_bits, rotation, v_rotation):
    if q.ndim != 3:
        raise ValueError(f"q must be (batch, query_heads, head_dim), got {tuple(q.shape)}")
    batch, n_heads, dim = q.shape
    for name, codes, norms, bits in (("k", k_codes, k_norms, k_bits), ("v", v_codes, v_norms, v_bits)):
        if codes.ndim != 4 or codes.dtype != torch.uint8:
            raise ValueError(f"{name}_codes must be uint8 (batch, kv_heads, tokens, row_bytes), got "
                             f"{codes.dtype} {tuple(codes.shape)}")
        if codes.shape[-1] != packed_row_bytes(dim, bits):
            raise ValueError(f"{name}_codes rows must hold {packed_row_bytes(dim, bits)} bytes "
                             f"(head_dim={dim}, bits={bits}), got {codes.shape[-1]}")
        if norms.shape != codes.shape[:3]:
            raise ValueError(f"{name}_norms must be {tuple(codes.shape[:3])}, got {tuple(norms.shape)}")
        if codes.shape[0] != batch:
            raise ValueError(f"{name}_codes batch {codes.shape[0]} != q batch {batch}")
    if k_codes.shape[:3] != v_codes.shape[:3]:
        raise ValueError(f"k and v caches disagree: {tuple(k_codes.shape[:3])} vs {tuple(v_codes.shape[:3])}")
    n_kv_heads = k_codes.shape[1]
    if n_heads % n_kv_heads:
        raise ValueError(f"query heads ({n_heads}) must be a multiple of KV heads ({n_kv_heads})")
    if seq_lens.shape != (batch,) or seq_lens.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"seq_lens must be an int32/int64 tensor of shape ({batch},), got "
                         f"{seq_lens.dtype} {tuple(seq_lens.shape)}")
    for name, rot in (("rotation", rotation), ("v_rotation", v_rotation)):
        if rot.shape != (dim, dim):
            raise ValueError(f"{name} must be ({dim}, {dim}), got {tuple(rot.shape)}")


def default_num_splits(batch: int, n_kv_heads: int, max_tokens: int, device: torch.device,
                       block_n: int) -> int:
    """Splits so that about eight programs per SM run (flash-decoding), at least one tile per split.

    Eight rather than four: on the H200 twice the splits ran 5-10% faster at batch 8 (benchmarks/NOTES.md).
    """
    n_sm = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
    wanted = triton.cdiv(8 * n_sm, batch * n_kv_heads)
    return max(1, min(wanted, triton.cdiv(max_tokens, block_n)))


def decode_attention_triton(
    q: torch.Tensor,
    k_codes: torch.Tensor,
    k_norms: torch.Tensor,
    v_codes: torch.Tensor,
    v_norms: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    k_centroids: torch.Tensor,
    v_centroids: torch.Tensor,
    k_bits: int,
    v_bits: int,
    rotation: torch.Tensor,
    v_rotation: torch.Tensor | None = None,
    scale: float | None = None,
    num_splits: int | None = None,
    block_n: int = 64,
    num_warps: int = 4,
    num_stages: int = 2,
    lookup: bool = True,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention of one new query token per sequence over a packed cache: (batch, query_heads, head_dim).

    Args:
        q: (batch, query_heads, head_dim) unrotated queries (any float dtype; output has it too).
        k_codes, v_codes: uint8 (batch, kv_heads, tokens, ceil(head_dim * bits / 8)), the library's
            packed layout; the token axis may be strided (a slice of a larger cache).
        k_norms, v_norms: (batch, kv_heads, tokens) float16/float32 norms of the cached vectors.
        seq_lens: (batch,) number of valid cached tokens per row (<= tokens).
        k_centroids, v_centroids: 2^bits centroids of the key / value codebooks.
        rotation: dense Pi_K (head_dim, head_dim), y = Pi x; v_rotation: Pi_V (default Pi_K).
        scale: softmax scale, default 1 / sqrt(head_dim).
        num_splits: KV splits per (row, KV head); default fills the GPU (``default_num_splits``).
        block_n, num_warps, num_stages: tokens per tile, warps per program, pipeline depth (tuning).
        lookup: False skips the centroid lookups and returns wrong values (benchmark attribution only).
        return_lse: also return ``log sum_t exp(scale * <q, k~_t>)`` per (row, query head), float32
            (batch, query_heads), ``-inf`` for a row without tokens: what an exact merge with attention over
            other tokens needs (``o = sum_i exp(lse_i - lse) o_i``, ``lse = log sum_i exp(lse_i)``).
    """
    v_rotation = rotation if v_rotation is None else v_rotation
    _check(q, k_codes, k_norms, v_codes, v_norms, seq_lens, k_bits, v_bits, rotation, v_rotation)
    check_device(q.device)
    batch, n_heads, dim = q.shape
    n_kv_heads, max_tokens = k_codes.shape[1], k_codes.shape[2]
    group = n_heads // n_kv_heads
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    k_bpg, k_cpg = group_geometry(k_bits)
    v_bpg, v_cpg = group_geometry(v_bits)
    num_splits = num_splits or default_num_splits(batch, n_kv_heads, max_tokens, q.device, block_n)
    tokens_per_split = triton.cdiv(triton.cdiv(max_tokens, num_splits), block_n) * block_n
    num_splits = triton.cdiv(max_tokens, tokens_per_split) if max_tokens else 1

    k_groups = pow2_at_least(num_groups(dim, k_bits))
    q_rot = q.to(torch.float32) @ rotation.to(device=q.device, dtype=torch.float32).T
    q_stream = stream_queries(q_rot, k_cpg, k_groups)
    codes_norms = []
    for t in (k_codes, k_norms, v_codes, v_norms):
        codes_norms.append(t if t.stride(-1) == 1 else t.contiguous())
    k_codes, k_norms, v_codes, v_norms = codes_norms
    part_out = torch.empty((batch, n_heads, num_splits, dim), dtype=torch.float32, device=q.device)
    part_lse = torch.empty((batch, n_heads, num_splits), dtype=torch.float32, device=q.device)
    block_m = pow2_at_least(group)
    k_cent = k_centroids.to(device=q.device, dtype=torch.float16).contiguous()
    v_cent = v_centroids.to(device=q.device, dtype=torch.float16).contiguous()
    _decode_split_kernel[(batch, n_kv_heads, num_splits)](
        q_stream, k_codes, k_norms, v_codes, v_norms, seq_lens, k_cent, v_cent, part_out, part_lse,
        dim, k_codes.shape[-1], v_codes.shape[-1], tokens_per_split,
        q_stream.stride(0), q_stream.stride(1),
        k_codes.stride(0), k_codes.stride(1), k_codes.stride(2), k_norms.stride(0), k_norms.stride(1),
        v_codes.stride(0), v_codes.stride(1), v_codes.stride(2), v_norms.stride(0), v_norms.stride(1),
        part_out.stride(0), part_out.stride(1), part_out.stride(2), part_lse.stride(0), part_lse.stride(1),
        scale * math.log2(math.e),
        GROUP=group, BLOCK_M=block_m, BLOCK_N=block_n,
        K_BITS=k_bits, K_BPG=k_bpg, K_CPG=k_cpg, K_GROUPS=k_groups,
        V_BITS=v_bits, V_BPG=v_bpg, V_CPG=v_cpg, V_GROUPS=pow2_at_least(num_groups(dim, v_bits)),
        LOOKUP=lookup, num_warps=num_warps, num_stages=num_stages,
    )
    out = torch.empty((batch, n_heads, dim), dtype=q.dtype, device=q.device)
    lse = torch.empty((batch, n_heads), dtype=torch.float32, device=q.device) if return_lse else part_lse
    combine_m = 16
    _combine_kernel[(batch, triton.cdiv(n_heads, combine_m))](
        part_out, part_lse, v_rotation.to(device=q.device, dtype=torch.float32).contiguous(), out, lse,
        n_heads, num_splits, dim,
        part_out.stride(0), part_out.stride(1), part_out.stride(2), part_lse.stride(0), part_lse.stride(1),
        out.stride(0), out.stride(1), lse.stride(0),
        BLOCK_M=combine_m, BLOCK_D=pow2_at_least(dim), BLOCK_J=32, WRITE_LSE=return_lse,
        num_warps=4,
    )
    return (out, lse) if return_lse else out


def dequantize_cache_reference(codes: torch.Tensor, norms: torch.Tensor, centroids: torch.Tensor, bits: int,
                               rotation: torch.Tensor, dim: int) -> torch.Tensor:
    """Float64 ``n * Pi^T c[idx]`` for every cached vector: (..., dim)."""
    from turboquant.packing import unpack_codes

    rotated = centroids.to(torch.float64)[unpack_codes(codes, bits, dim).long()]
    return norms.to(torch.float64)[..., None] * (rotated @ rotation.to(torch.float64))


def decode_attention_reference(
    q: torch.Tensor, k_codes: torch.Tensor, k_norms: torch.Tensor, v_codes: torch.Tensor,
    v_norms: torch.Tensor, seq_lens: torch.Tensor, *, k_centroids: torch.Tensor, v_centroids: torch.Tensor,
    k_bits: int, v_bits: int, rotation: torch.Tensor, v_rotation: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """Float64 attention over the dequantized cache (rows masked past ``seq_lens``): (batch, heads, dim)."""
    v_rotation = rotation if v_rotation is None else v_rotation
    _check(q, k_codes, k_norms, v_codes, v_norms, seq_lens, k_bits, v_bits, rotation, v_rotation)
    _batch, n_heads, dim = q.shape
    group = n_heads // k_codes.shape[1]
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    keys = dequantize_cache_reference(k_codes, k_norms, k_centroids, k_bits, rotation, dim)
    values = dequantize_cache_reference(v_codes, v_norms, v_centroids, v_bits, v_rotation, dim)
    keys = keys.repeat_interleave(group, dim=1)
    values = values.repeat_interleave(group, dim=1)
    logits = scale * torch.einsum("bhd,bhtd->bht", q.to(torch.float64), keys)
    valid = torch.arange(keys.shape[2], device=q.device)[None, :] < seq_lens.to(q.device)[:, None]
    logits = logits.masked_fill(~valid[:, None, :], float("-inf"))
    weights = torch.softmax(logits, dim=-1).nan_to_num(0.0)
    return torch.einsum("bht,bhtd->bhd", weights, values)
