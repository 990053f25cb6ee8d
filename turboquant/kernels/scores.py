"""Inner products of queries with TurboQuant_mse-packed keys, decoded in registers (attention logits).

For a key stored as codes ``idx`` and norm ``n`` (Algorithm 1), its dequantization is
``k~ = n * Pi^T c[idx]``, so for a query q

    <q, k~> = n * <Pi q, c[idx]>.

The query is rotated once (``q_rot = Pi q``, outside the kernel); keys are never rotated back. Each
program decodes a tile of packed keys to fp16 centroid values in registers (a 2^b-entry table) and
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

from ._layout import (
    group_geometry,
    load_group_words,
    num_groups,
    packed_row_bytes,
    pow2_at_least,
)


LOOKUPS = {"none": 0, "codes": 1, "pairs": 2, "prmt": 3}
"""How a kernel turns codes into centroid values: ``codes`` loads c[idx] per code from the 2^b-entry
table (L1-resident); ``pairs`` (4-bit only) loads both values of a byte at once from a 256-entry table
of fp16 pairs (half the loads); ``prmt`` (4-bit, CUDA only) decodes 8 codes of a 32-bit word in
registers with byte permutes (``decode_nibbles_prmt``), no loads; ``none`` skips the lookup and
returns wrong values, only to attribute time in the benchmark."""

_PRMT_DECODE = tl.constexpr("""{
.reg .b32 s, x, m, la, lb, ha, hb, lo, hi, w, o;
mov.b32 w, $8;
and.b32 s, w, 0x7777;
prmt.b32 la, $9, $10, s;
prmt.b32 lb, $11, $12, s;
prmt.b32 ha, $13, $14, s;
prmt.b32 hb, $15, $16, s;
prmt.b32 x, w, 0, 0x1100;
shl.b32 m, x, 4;
lop3.b32 x, x, m, 0xFF00FF00, 0xE4;
prmt.b32 m, x, 0, 0xBA98;
lop3.b32 lo, la, lb, m, 0xD8;
lop3.b32 hi, ha, hb, m, 0xD8;
prmt.b32 o, lo, hi, 0x5140;
mov.b32 {$0, $1}, o;
prmt.b32 o, lo, hi, 0x7362;
mov.b32 {$2, $3}, o;
shr.u32 w, w, 16;
and.b32 s, w, 0x7777;
prmt.b32 la, $9, $10, s;
prmt.b32 lb, $11, $12, s;
prmt.b32 ha, $13, $14, s;
prmt.b32 hb, $15, $16, s;
prmt.b32 x, w, 0, 0x1100;
shl.b32 m, x, 4;
lop3.b32 x, x, m, 0xFF00FF00, 0xE4;
prmt.b32 m, x, 0, 0xBA98;
lop3.b32 lo, la, lb, m, 0xD8;
lop3.b32 hi, ha, hb, m, 0xD8;
prmt.b32 o, lo, hi, 0x5140;
mov.b32 {$4, $5}, o;
prmt.b32 o, lo, hi, 0x7362;
mov.b32 {$6, $7}, o;
}""")
"""8 nibbles of a 32-bit word -> 8 fp16 table values. The 16-entry fp16 table is given as 8 registers:
the low bytes of c[0..15] ($9..$12, 4 per register) and the high bytes ($13..$16). For 4 nibbles at a
time, ``prmt`` looks up both halves of the table (selector = nibble & 7), a sign-replicating ``prmt``
turns bit 3 of each nibble into a byte mask that picks the half, and two more ``prmt`` interleave low
and high bytes into fp16 pairs: 16 instructions per 8 codes."""


def prmt_table(centroids: torch.Tensor) -> list[int]:
    """The 8 int32 table registers of ``_PRMT_DECODE`` for a 16-entry codebook (low bytes, then high bytes)."""
    if centroids.numel() != 16:
        raise ValueError("the prmt decoder needs a 16-entry (4-bit) codebook")
    halves = centroids.detach().to(dtype=torch.float16, device="cpu").view(torch.int16).to(torch.int64) & 0xFFFF
    low, high = (halves & 0xFF).tolist(), (halves >> 8).tolist()
    regs = []
    for plane in (low, high):
        for r in range(4):
            word = sum(plane[4 * r + i] << (8 * i) for i in range(4))
            regs.append(word - (1 << 32) if word >= 1 << 31 else word)
    return regs


@triton.jit
def decode_nibbles_prmt(words, t0, t1, t2, t3, t4, t5, t6, t7):
    """Tuple of 8 fp16 tensors: value of nibble k (bits 4k..4k+3) of every int32 word, k = 0..7."""
    return tl.inline_asm_elementwise(
        _PRMT_DECODE, "=h,=h,=h,=h,=h,=h,=h,=h,r,r,r,r,r,r,r,r,r",
        [words, t0, t1, t2, t3, t4, t5, t6, t7],
        dtype=(tl.float16,) * 8, is_pure=True, pack=1,
    )


def lookup_table(centroids: torch.Tensor, bits: int, lookup: str, device: torch.device) -> torch.Tensor:
    """The table the kernel reads: fp16 centroids, or for ``pairs`` int32 [b] = fp16(c[b & 15]) | fp16(c[b >> 4]) << 16."""
    if lookup not in LOOKUPS:
        raise ValueError(f"lookup must be one of {tuple(LOOKUPS)}, got {lookup!r}")
    values = centroids.to(device=device, dtype=torch.float16).contiguous()
    if lookup != "pairs":
        return values
    if bits != 4:
        raise ValueError("lookup='pairs' needs 4-bit codes (two per byte)")
    half_bits = values.view(torch.int16).to(torch.int64) & 0xFFFF
    byte = torch.arange(256, device=device)
    entry = half_bits[byte & 15] | (half_bits[byte >> 4] << 16)
    return torch.where(entry >= 2 ** 31, entry - 2 ** 32, entry).to(torch.int32).contiguous()


@triton.jit
def decode_codes(words, table_ptr, k: tl.constexpr, BITS: tl.constexpr, LOOKUP: tl.constexpr):
    """fp16 centroid values of code ``k`` of every group in ``words`` (any shape); LOOKUP 1 or 0."""
    codes = (words >> (BITS * k)) & ((1 << BITS) - 1)
    if LOOKUP == 1:
        return tl.load(table_ptr + codes)
    return codes.to(tl.float16)


@triton.jit
def decode_pairs(words, table_ptr):
    """fp16 values of the low (even coordinate) and high (odd) nibble of every byte: one load per byte."""
    entry = tl.load(table_ptr + words)
    even = (entry & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True)
    odd = (entry >> 16).to(tl.int16).to(tl.float16, bitcast=True)
    return even, odd


@triton.jit
def _query_slice(q_cols, mask_m, g_offs, k: tl.constexpr, groups_padded):
    """Query coordinates g * cpg + k for groups ``g_offs``, transposed: (groups, queries)."""
    return tl.load(q_cols + (k * groups_padded + g_offs)[:, None], mask=mask_m[None, :], other=0.0)


@triton.jit
def _mse_scores_kernel(
    q_ptr, codes_ptr, norms_ptr, cent_ptr, out_ptr,
    n_queries, n_keys, row_bytes, n_groups, groups_padded,
    stride_qb, stride_qm, stride_cb, stride_cn, stride_nb, stride_ob, stride_om,
    scale, t0, t1, t2, t3, t4, t5, t6, t7,
    BITS: tl.constexpr, BYTES_PER_GROUP: tl.constexpr, CODES_PER_GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_G: tl.constexpr, LOOKUP: tl.constexpr,
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
        if LOOKUP == 3:
            v0, v1, v2, v3, v4, v5, v6, v7 = decode_nibbles_prmt(words, t0, t1, t2, t3, t4, t5, t6, t7)
            acc = tl.dot(v0, _query_slice(q_cols, mask_m, g_offs, 0, groups_padded), acc)
            acc = tl.dot(v1, _query_slice(q_cols, mask_m, g_offs, 1, groups_padded), acc)
            acc = tl.dot(v2, _query_slice(q_cols, mask_m, g_offs, 2, groups_padded), acc)
            acc = tl.dot(v3, _query_slice(q_cols, mask_m, g_offs, 3, groups_padded), acc)
            acc = tl.dot(v4, _query_slice(q_cols, mask_m, g_offs, 4, groups_padded), acc)
            acc = tl.dot(v5, _query_slice(q_cols, mask_m, g_offs, 5, groups_padded), acc)
            acc = tl.dot(v6, _query_slice(q_cols, mask_m, g_offs, 6, groups_padded), acc)
            acc = tl.dot(v7, _query_slice(q_cols, mask_m, g_offs, 7, groups_padded), acc)
        elif LOOKUP == 2:
            even, odd = decode_pairs(words, cent_ptr)
            q_even = tl.load(q_cols + g_offs[:, None], mask=mask_m[None, :], other=0.0)
            q_odd = tl.load(q_cols + (groups_padded + g_offs)[:, None], mask=mask_m[None, :], other=0.0)
            acc = tl.dot(even, q_even, acc)
            acc = tl.dot(odd, q_odd, acc)
        else:
            for k in tl.static_range(CODES_PER_GROUP):
                keys = decode_codes(words, cent_ptr, k, BITS, LOOKUP)
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
    lookup: str = "codes",
) -> torch.Tensor:
    """``scale * <q_rot[b, i], c[codes[b, t]]> * norms[b, t]`` for every b, i, t: (batch, m, n).

    Args:
        q_rot: rotated queries (batch, m, dim), any float dtype (used as fp16 on the tensor cores).
        codes: packed keys (batch, n, ceil(dim * bits / 8)) uint8, the library's layout; the key
            axis may be strided (e.g. a slice of a cache) but each row must be contiguous.
        norms: key norms (batch, n), float16 or float32.
        centroids: the codebook's 2^bits centroids (unit-sphere scale).
        block_m, block_n, num_warps: tile shape and warps per program (tuning).
        lookup: how codes become values (``LOOKUPS``); "none" returns wrong values (benchmark only).
    """
    _check(q_rot, codes, norms, centroids, bits)
    batch, n_queries, dim = q_rot.shape
    n_keys = codes.shape[1]
    if codes.stride(-1) != 1:
        codes = codes.contiguous()
    if norms.stride(-1) != 1:
        norms = norms.contiguous()
    codes, geometry, table, table_regs = decode_setup(codes, centroids, bits, dim, lookup)
    bytes_per_group, codes_per_group, groups = geometry
    block_g = min(pow2_at_least(groups), 128)
    groups_padded = triton.cdiv(groups, block_g) * block_g
    q_stream = stream_queries(q_rot, codes_per_group, groups_padded)
    out = torch.empty((batch, n_queries, n_keys), dtype=out_dtype, device=q_rot.device)
    if out.numel() == 0:
        return out
    block_m = block_m or min(64, pow2_at_least(n_queries))
    grid = (triton.cdiv(n_keys, block_n), triton.cdiv(n_queries, block_m), batch)
    _mse_scores_kernel[grid](
        q_stream, codes, norms, table, out,
        n_queries, n_keys, codes.shape[-1], groups, groups_padded,
        q_stream.stride(0), q_stream.stride(1), codes.stride(0), codes.stride(1), norms.stride(0),
        out.stride(0), out.stride(1),
        scale, *table_regs,
        BITS=bits, BYTES_PER_GROUP=bytes_per_group, CODES_PER_GROUP=codes_per_group,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_G=block_g, LOOKUP=LOOKUPS[lookup],
        num_warps=num_warps,
    )
    return out


def decode_setup(codes: torch.Tensor, centroids: torch.Tensor, bits: int, dim: int, lookup: str):
    """What a kernel needs to decode ``codes`` with ``lookup``.

    Returns ``(codes, (bytes_per_group, codes_per_group, n_groups), table, table_regs)``: for ``prmt``
    the codes are reinterpreted as int32 words (a group is one word of 8 nibbles) and the table is
    passed as 8 int32 scalars; otherwise groups are bytes as in ``_layout`` and the table is a tensor.
    """
    table = lookup_table(centroids, bits, lookup if lookup != "prmt" else "codes", codes.device)
    if lookup != "prmt":
        bytes_per_group, codes_per_group = group_geometry(bits)
        return codes, (bytes_per_group, codes_per_group, num_groups(dim, bits)), table, [0] * 8
    if bits != 4 or codes.device.type != "cuda":
        raise ValueError("lookup='prmt' needs 4-bit codes on a CUDA device (inline PTX)")
    if codes.shape[-1] % 4 or codes.storage_offset() % 4 or any(st % 4 for st in codes.stride()[:-1]):
        raise ValueError("lookup='prmt' needs rows of a multiple of 4 bytes, 4-byte aligned (dim % 8 == 0)")
    words = codes.view(torch.int32)
    return words, (1, 8, words.shape[-1]), table, prmt_table(centroids)


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
