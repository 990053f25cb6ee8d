"""Inner products of queries with TurboQuant_mse-packed keys, decoded in registers (attention logits).

For a key stored as codes ``idx`` and norm ``n`` (Algorithm 1), its dequantization is
``k~ = n * Pi^T c[idx]``, so for a query q

    <q, k~> = n * <Pi q, c[idx]>.

The query is rotated once (``q_rot = Pi q``, outside the kernel); keys are never rotated back. Each
program decodes a tile of packed keys to fp16 centroid values in registers (``_decode``: a 2^b-entry table, or a
register codebook) and
multiplies it with the query tile on the tensor cores (``tl.dot``, fp32 accumulation), then scales
column t by ``n_t * scale``. The only bytes read are the packed codes and norms: at d = 128, b = 4,
66 bytes per key against 512 for fp32 and 256 for bf16 keys (the blog's "up to 8x" is this ratio).

Codes are consumed group-wise (``_layout``): for each position k inside a group, the k-th codes of
all groups are decoded and multiplied with the matching coordinates of the query (permuted once on
the host, ``stream_queries``), so no codes are shuffled in registers.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..codebook import symmetric_codebook
from ..packing import packed_size
from ._decode import code_values, nibble_pair_values, resolve_decoder, three_bit_group_values
from ._layout import (
    check_device,
    group_geometry,
    load_group_words,
    num_groups,
    pow2_at_least,
)


@triton.jit
def _mse_scores_kernel(
    q_ptr, codes_ptr, norms_ptr, cent_ptr, out_ptr,
    n_queries, n_keys, row_bytes, n_groups, groups_padded,
    stride_qb, stride_qm, stride_cb, stride_cn, stride_nb, stride_ob, stride_om,
    scale,
    BITS: tl.constexpr, BYTES_PER_GROUP: tl.constexpr, CODES_PER_GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_G: tl.constexpr, DECODE: tl.constexpr,
):
    """Scores transposed, (keys, queries) per tile, so the decoded keys are the A operand of tl.dot as loaded.

    ``q_ptr`` holds the queries in stream order (``stream_queries``): [b, m, k * groups_padded + g]
    is coordinate g * CODES_PER_GROUP + k.
    """
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    batch = tl.program_id(2).to(tl.int64)
    rows_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rows_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = rows_m < n_queries
    mask_n = rows_n < n_keys
    q_cols = q_ptr + batch * stride_qb + rows_m[None, :] * stride_qm
    code_rows = codes_ptr + batch * stride_cb + rows_n.to(tl.int64) * stride_cn
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for g0 in range(0, n_groups, BLOCK_G):
        g_offs = tl.multiple_of(g0, BLOCK_G) + tl.arange(0, BLOCK_G)
        words = load_group_words(code_rows, mask_n, g_offs, row_bytes, BYTES_PER_GROUP)
        if CODES_PER_GROUP == 2:  # 4-bit: both codes of a byte at once
            even, odd = nibble_pair_values(words, cent_ptr, DECODE)
            acc = tl.dot(even, tl.load(q_cols + g_offs[:, None], mask=mask_m[None, :], other=0.0), acc)
            acc = tl.dot(odd, tl.load(q_cols + (groups_padded + g_offs)[:, None], mask=mask_m[None, :], other=0.0),
                         acc)
        elif BITS == 3:  # the 8 codes of a group word decoded at once
            keys = three_bit_group_values(words, cent_ptr, DECODE)
            for k in tl.static_range(8):
                q_t = tl.load(q_cols + (k * groups_padded + g_offs)[:, None], mask=mask_m[None, :], other=0.0)
                acc = tl.dot(keys[k], q_t, acc)
        else:
            for k in tl.static_range(CODES_PER_GROUP):
                keys = code_values(words, BITS * k, cent_ptr, BITS, DECODE)
                q_t = tl.load(q_cols + (k * groups_padded + g_offs)[:, None], mask=mask_m[None, :], other=0.0)
                acc = tl.dot(keys, q_t, acc)
    norms = tl.load(norms_ptr + batch * stride_nb + rows_n, mask=mask_n, other=0.0).to(tl.float32)
    out = acc * (norms * scale)[:, None]
    out_ptrs = out_ptr + batch * stride_ob + rows_m[None, :] * stride_om + rows_n[:, None]
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=mask_n[:, None] & mask_m[None, :])


def stream_queries(q_rot: torch.Tensor, codes_per_group: int, groups_padded: int) -> torch.Tensor:
    """fp16 (..., codes_per_group * groups_padded): [..., k * groups_padded + g] = q_rot[..., g * cpg + k], 0-padded."""
    dim = q_rot.shape[-1]
    padded = torch.zeros(*q_rot.shape[:-1], groups_padded * codes_per_group, dtype=torch.float16,
                         device=q_rot.device)
    padded[..., :dim] = q_rot
    grouped = padded.reshape(*q_rot.shape[:-1], groups_padded, codes_per_group)
    return grouped.transpose(-1, -2).reshape(*q_rot.shape[:-1], -1).contiguous()


def _check(q_rot: torch.Tensor, codes: torch.Tensor, norms: torch.Tensor, centroids: torch.Tensor,
           bits: int) -> None:
    if q_rot.ndim != 3 or codes.ndim != 3 or norms.ndim != 2:
        raise ValueError("expected q_rot (batch, m, dim), codes (batch, n, row_bytes), norms (batch, n); got "
                         f"{tuple(q_rot.shape)}, {tuple(codes.shape)}, {tuple(norms.shape)}")
    batch, _, dim = q_rot.shape
    if codes.shape[0] != batch or norms.shape != codes.shape[:2]:
        raise ValueError(f"batch/key dims disagree: q_rot {tuple(q_rot.shape)}, codes {tuple(codes.shape)}, "
                         f"norms {tuple(norms.shape)}")
    if codes.dtype != torch.uint8 or codes.shape[-1] != packed_size(dim, bits):
        raise ValueError(f"codes must be uint8 with {packed_size(dim, bits)} bytes per row for dim={dim}, "
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
    block_n: int = 128,
    num_warps: int = 4,
    lookup: bool = True,
    decoder: str = "auto",
    kernel: str = "tiles",
) -> torch.Tensor:
    """``scale * <q_rot[b, i], c[codes[b, t]]> * norms[b, t]`` for every b, i, t: (batch, m, n).

    Args:
        q_rot: rotated queries (batch, m, dim), any float dtype (used as fp16 on the tensor cores).
        codes: packed keys (batch, n, ceil(dim * bits / 8)) uint8, the library's layout; the key
            axis may be strided (e.g. a slice of a cache) but each row must be contiguous.
        norms: key norms (batch, n), float16 or float32.
        centroids: the codebook's 2^bits centroids (unit-sphere scale).
        block_m, block_n, num_warps: tile shape and warps per program (tuning).
        lookup: False skips the centroid lookup and returns wrong values (benchmark attribution only).
        decoder: how codes become centroids in registers (``_decode``): ``"table"`` (gather), ``"select"``
            (register codebook), ``"prmt"`` (inline PTX for 3- and 4-bit codes, GPU only); the last two need the
            symmetric Lloyd-Max codebook; ``"auto"``: ``"prmt"`` on CUDA, else ``"table"``.
        kernel: ``"tiles"`` (this module's kernel; ``block_m`` / ``block_n`` / ``num_warps`` / ``lookup`` /
            ``decoder`` tune it) or ``"mma"`` (:mod:`turboquant.kernels.scores_mma`, Gluon, GPU only: the decoded keys
            as register operands of ``mma.sync``, for 3- and 4-bit codes of 128 channels and at most 16 queries per
            key set; 32 keys per tile there, the tuning options above unused).
    """
    _check(q_rot, codes, norms, centroids, bits)
    check_device(q_rot.device)
    if kernel not in ("tiles", "mma"):
        raise ValueError(f"kernel must be 'tiles' or 'mma', got {kernel!r}")
    if kernel == "mma":  # Gluon, imported only here: Triton releases before Gluon still run the tile kernel
        from .scores_mma import mma_scores, mma_scores_unsupported

        reason = mma_scores_unsupported(q_rot, codes, centroids, bits)
        if reason is not None:
            raise ValueError(f"kernel='mma': {reason}")
        out = torch.empty((q_rot.shape[0], q_rot.shape[1], codes.shape[1]), dtype=out_dtype, device=q_rot.device)
        if out.numel():
            mma_scores(q_rot, codes, norms, centroids, bits, scale, out)
        return out
    decoder = resolve_decoder(decoder, q_rot.device, lambda: symmetric_codebook(centroids))
    batch, n_queries, dim = q_rot.shape
    n_keys = codes.shape[1]
    if codes.stride(-1) != 1:
        codes = codes.contiguous()
    if norms.stride(-1) != 1:
        norms = norms.contiguous()
    bytes_per_group, codes_per_group = group_geometry(bits)
    groups = num_groups(dim, bits)
    block_g = min(pow2_at_least(groups), 128)
    groups_padded = triton.cdiv(groups, block_g) * block_g
    q_stream = stream_queries(q_rot, codes_per_group, groups_padded)
    out = torch.empty((batch, n_queries, n_keys), dtype=out_dtype, device=q_rot.device)
    if out.numel() == 0:
        return out
    block_m = block_m or min(64, pow2_at_least(n_queries))
    grid = (triton.cdiv(n_keys, block_n), triton.cdiv(n_queries, block_m), batch)
    _mse_scores_kernel[grid](
        q_stream, codes, norms, centroids.to(device=q_rot.device, dtype=torch.float16).contiguous(), out,
        n_queries, n_keys, codes.shape[-1], groups, groups_padded,
        q_stream.stride(0), q_stream.stride(1), codes.stride(0), codes.stride(1), norms.stride(0),
        out.stride(0), out.stride(1),
        scale,
        BITS=bits, BYTES_PER_GROUP=bytes_per_group, CODES_PER_GROUP=codes_per_group,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_G=block_g, DECODE=decoder if lookup else "none",
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
