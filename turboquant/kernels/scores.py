"""Inner products of queries with TurboQuant_mse-packed keys, decoded in registers (attention logits).

For a key stored as codes ``idx`` and norm ``n`` (Algorithm 1), its dequantization is
``k~ = n * Pi^T c[idx]``, so for a query q

    <q, k~> = n * <Pi q, c[idx]>.

The query is rotated once (``q_rot = Pi q``, outside the kernel); keys are never rotated back. Each
program decodes a tile of packed keys to fp16 centroid values in registers (a 2^b-entry table) and
multiplies it with the query tile on the tensor cores (``tl.dot``, fp32 accumulation), then scales
column t by ``n_t * scale``. The only bytes read are the packed codes and norms: at d = 128, b = 4,
66 bytes per key against 512 for fp32 and 256 for bf16 keys (the blog's "up to 8x" is this ratio).

Codes are consumed in stream order (``_layout``); the query is loaded at the matching offsets.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._layout import (
    group_geometry,
    load_group_words,
    num_groups,
    packed_row_bytes,
    pow2_at_least,
    stream_coordinates,
    words_to_stream_codes,
)


@triton.jit
def decode_tile(code_rows, row_mask, g_offs, row_bytes, cent_ptr,
                BITS: tl.constexpr, BYTES_PER_GROUP: tl.constexpr, CODES_PER_GROUP: tl.constexpr,
                LOOKUP: tl.constexpr):
    """Centroid values (fp16) of groups ``g_offs`` of the packed rows: (rows, CODES_PER_GROUP * groups), stream order.

    ``LOOKUP=False`` returns the raw codes as fp16 instead (wrong values): the benchmark uses it to
    attribute time to the centroid-table lookup.
    """
    words = load_group_words(code_rows, row_mask, g_offs, row_bytes, BYTES_PER_GROUP)
    codes = words_to_stream_codes(words, BITS, CODES_PER_GROUP)
    if LOOKUP:
        return tl.load(cent_ptr + codes)
    return codes.to(tl.float16)


@triton.jit
def _mse_scores_kernel(
    q_ptr, codes_ptr, norms_ptr, cent_ptr, out_ptr,
    n_queries, n_keys, dim, row_bytes, n_groups,
    stride_qb, stride_qm, stride_cb, stride_cn, stride_nb, stride_ob, stride_om,
    scale,
    BITS: tl.constexpr, BYTES_PER_GROUP: tl.constexpr, CODES_PER_GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_G: tl.constexpr, LOOKUP: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    batch = tl.program_id(2).to(tl.int64)
    rows_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rows_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = rows_m < n_queries
    mask_n = rows_n < n_keys
    q_rows = q_ptr + batch * stride_qb + rows_m * stride_qm
    code_rows = codes_ptr + batch * stride_cb + rows_n.to(tl.int64) * stride_cn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for g0 in range(0, n_groups, BLOCK_G):
        g_offs = g0 + tl.arange(0, BLOCK_G)
        coords = stream_coordinates(g_offs, CODES_PER_GROUP)
        q = tl.load(q_rows[:, None] + coords[None, :], mask=mask_m[:, None] & (coords < dim)[None, :], other=0.0)
        keys = decode_tile(code_rows, mask_n, g_offs, row_bytes, cent_ptr, BITS, BYTES_PER_GROUP, CODES_PER_GROUP,
                           LOOKUP)
        acc = tl.dot(q.to(tl.float16), tl.trans(keys), acc)
    norms = tl.load(norms_ptr + batch * stride_nb + rows_n, mask=mask_n, other=0.0).to(tl.float32)
    out = acc * (norms * scale)[None, :]
    out_ptrs = out_ptr + batch * stride_ob + rows_m[:, None] * stride_om + rows_n[None, :]
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


def _check(q_rot: torch.Tensor, codes: torch.Tensor, norms: torch.Tensor, centroids: torch.Tensor,
           bits: int) -> None:
    if q_rot.ndim != 3 or codes.ndim != 3 or norms.ndim != 2:
        raise ValueError("expected q_rot (batch, m, dim), codes (batch, n, row_bytes), norms (batch, n); got "
                         f"{tuple(q_rot.shape)}, {tuple(codes.shape)}, {tuple(norms.shape)}")
    batch, _, dim = q_rot.shape
    if codes.shape[0] != batch or norms.shape != codes.shape[:2]:
        raise ValueError(f"batch/key dims disagree: q_rot {tuple(q_rot.shape)}, codes {tuple(codes.shape)}, "
                         f"norms {tuple(norms.shape)}")
    if codes.dtype != torch.uint8 or codes.shape[-1] != packed_row_bytes(dim, bits):
        raise ValueError(f"codes must be uint8 with {packed_row_bytes(dim, bits)} bytes per row for dim={dim}, "
                         f"bits={bits}; got {codes.dtype} with {codes.shape[-1]}")
    if centroids.numel() != 2 ** bits:
        raise ValueError(f"{bits}-bit codebook has {2 ** bits} centroids, got {centroids.numel()}")
    devices = {t.device for t in (q_rot, codes, norms)}
    if len(devices) != 1:
        raise ValueError(f"q_rot, codes and norms must be on one device, got {devices}")


def mse_scores_triton(
    q_rot: torch.Tensor,
    codes: torch.Tensor,
    norms: torch.Tensor,
    centroids: torch.Tensor,
    bits: int,
    scale: float = 1.0,
    out_dtype: torch.dtype = torch.float32,
    *,
    block_m: int | None = None,
    block_n: int = 64,
    num_warps: int = 4,
    lookup: bool = True,
) -> torch.Tensor:
    """``scale * <q_rot[b, i], c[codes[b, t]]> * norms[b, t]`` for every b, i, t: (batch, m, n).

    Args:
        q_rot: rotated queries (batch, m, dim), any float dtype (used as fp16 on the tensor cores).
        codes: packed keys (batch, n, ceil(dim * bits / 8)) uint8, the library's layout; the key
            axis may be strided (e.g. a slice of a cache) but each row must be contiguous.
        norms: key norms (batch, n), float16 or float32.
        centroids: the codebook's 2^bits centroids (unit-sphere scale).
        block_m, block_n, num_warps: tile shape and warps per program (tuning).
        lookup: False skips the centroid lookup and returns wrong values; only for attributing time.
    """
    _check(q_rot, codes, norms, centroids, bits)
    batch, n_queries, dim = q_rot.shape
    n_keys = codes.shape[1]
    bytes_per_group, codes_per_group = group_geometry(bits)
    groups = num_groups(dim, bits)
    if q_rot.stride(-1) != 1:
        q_rot = q_rot.contiguous()
    if codes.stride(-1) != 1:
        codes = codes.contiguous()
    if norms.stride(-1) != 1:
        norms = norms.contiguous()
    out = torch.empty((batch, n_queries, n_keys), dtype=out_dtype, device=q_rot.device)
    if out.numel() == 0:
        return out
    block_m = block_m or min(64, pow2_at_least(n_queries))
    block_g = min(pow2_at_least(groups), max(16, 256 // codes_per_group))
    grid = (triton.cdiv(n_keys, block_n), triton.cdiv(n_queries, block_m), batch)
    _mse_scores_kernel[grid](
        q_rot, codes, norms, centroids.to(device=q_rot.device, dtype=torch.float16).contiguous(), out,
        n_queries, n_keys, dim, codes.shape[-1], groups,
        q_rot.stride(0), q_rot.stride(1), codes.stride(0), codes.stride(1), norms.stride(0),
        out.stride(0), out.stride(1),
        scale,
        BITS=bits, BYTES_PER_GROUP=bytes_per_group, CODES_PER_GROUP=codes_per_group,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_G=block_g, LOOKUP=lookup,
        num_warps=num_warps,
    )
    return out


def mse_scores_reference(
    q_rot: torch.Tensor, codes: torch.Tensor, norms: torch.Tensor, centroids: torch.Tensor, bits: int,
    scale: float = 1.0,
) -> torch.Tensor:
    """Float64 reference of :func:`mse_scores_triton` through ``turboquant.unpack_codes``."""
    from turboquant.packing import unpack_codes

    _check(q_rot, codes, norms, centroids, bits)
    dim = q_rot.shape[-1]
    keys = centroids.to(torch.float64)[unpack_codes(codes, bits, dim).long()]
    return scale * torch.einsum("bmd,bnd->bmn", q_rot.to(torch.float64), keys) * norms.to(torch.float64)[:, None, :]
