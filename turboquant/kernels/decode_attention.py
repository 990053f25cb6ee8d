"""Flash-decoding attention for one new token per sequence over a TurboQuant-packed K and V cache.

Cache (per batch row b, KV head h, token t). A stream (keys or values) holds each vector as one or two
*channel groups* ``g`` (the outlier split of the fractional-bit presets: ``m_0`` outlier channels first, then
the other ``m_1``), taken in a per-(b, h) channel order ``P`` (``x_P = x[perm]``; identity without a split).
Group ``g`` of ``x_P`` is quantized on its own, with its own rotation ``Pi_g``, codebook ``c_g`` and norm:

    TurboQuant_mse  (Alg. 1):  x~_g = n_g Pi_g^T c_g[idx_g]
    TurboQuant_prod (Alg. 2):  x~_g = n_g (Pi_g^T c_g[idx_g] + gamma_g rho_g S_g^T z_g),   gamma_g = sqrt(pi/2) / m_g,

with ``idx`` the (b-1)-bit MSE codes for prod (none at 1 bit), ``z = sign(S_g r)`` in {-1, +1}^m the QJL sign bits
of the unit vector's residual ``r`` (``S_g`` acts on the group's unrotated channels, as in ``turboquant.QJL``) and
``rho = ||r||``. So a logit is a sum of *stages*, each a per-token weight times an inner product of a
stage query with a table entry per code:

    s_t = scale * sum_g n_{g,t} ( <Pi_g q_g, c_g[idx_{g,t}]> + rho_{g,t} <gamma_g S_g q_g, z_{g,t}> ),   q_g = (q_P)_g.

Every stage query is a linear map of ``q_P`` (the query in its KV head's key channel order; the GQA group of
query heads shares it): the host gathers ``q_P`` and multiplies it once by the fixed (head_dim, L) matrix
:attr:`CacheFormat.query_map` that stacks ``Pi_g`` and ``gamma_g S_g`` (block-diagonal over the groups, columns
in the kernel's stream order). Keys are never decoded to vectors. Values, with ``p = softmax(s)``:

    o_P = concat_g Pi_g^T ( sum_t p_t n_{g,t} c_g[idx_{g,t}] ),    o[perm_V[j]] = o_P[j],

i.e. each value group is accumulated in its own rotated domain, rotated back once on the (head_dim,) output
(one block-diagonal matrix) and un-permuted to the model's channel order.

Kernel 1 (split): one program per (batch row, KV head, KV split) covering the whole GQA group of query
heads, so each cache byte is read once. It walks its token range in tiles, decodes codes to fp16 table
values in registers (QJL sign bits to +-1 without a table), computes each stage's logits and ``P V`` with
``tl.dot`` (fp32 accumulation) and an online softmax, and writes the split's normalized output (rotated,
groups concatenated) and log-sum-exp. The second channel group and the QJL stages are ``tl.constexpr`` flags:
a one-group TurboQuant_mse cache compiles to the one-stage kernel.
Kernel 2 (combine): one program per (batch row, block of query heads) merges the splits by their
log-sum-exp and applies the block-diagonal ``Pi_V^T`` (a small matmul), writing the output in the query's
dtype, scattered through ``perm_V`` when values are split.

Sequence lengths may differ within the batch (``seq_lens``); tokens at or past a row's length are
never read. No causal mask is needed: the new token attends to every cached token.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import triton
import triton.language as tl

from ._layout import (
    SUPPORTED_BITS,
    check_device,
    group_geometry,
    load_group_words,
    num_groups,
    packed_row_bytes,
    pow2_at_least,
    stream_coordinates,
    words_to_stream_codes,
)
from .scores import decode_codes

MAX_CHANNEL_GROUPS = 2


# ------------------------------------------------------------------------------------------ host-side format
class GroupFields(NamedTuple):
    """The packed fields of one channel group of a cached stream, token axis at dim 2 (the library's layout)."""

    codes: torch.Tensor                         # uint8 (B, H, T, ceil(m * bits / 8)); (B, H, T, 0) for QJL alone
    norms: torch.Tensor                         # (B, H, T) float16/float32: n = ||x_g||
    signs: torch.Tensor | None = None           # uint8 (B, H, T, ceil(m / 8)): QJL sign bits (TurboQuant_prod)
    residual_norms: torch.Tensor | None = None  # (B, H, T): rho = ||r|| of the unit vector's residual


@dataclass(frozen=True, eq=False)
class ChannelGroup:
    """How one channel group was quantized: ``bits``-bit TurboQuant_mse with rotation ``Pi`` (dense, y = Pi x) and
    codebook centroids ``c``; with ``sketch`` (QJL's S) also the QJL stage of TurboQuant_prod, whose MSE stage is
    then the ``bits``-bit one (0: QJL alone, no rotation or codebook)."""

    dim: int
    bits: int
    rotation: torch.Tensor | None = None
    centroids: torch.Tensor | None = None
    sketch: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.bits not in (0, *SUPPORTED_BITS):
            raise ValueError(f"the decode kernel reads MSE codes of {SUPPORTED_BITS[0]}-{SUPPORTED_BITS[-1]} bits "
                             f"(0 with a QJL sketch), got bits={self.bits}")
        if self.bits == 0 and self.sketch is None:
            raise ValueError("a channel group with bits=0 needs a QJL sketch (TurboQuant_prod at 1 bit)")
        square = (self.dim, self.dim)
        if self.bits and (self.rotation is None or tuple(self.rotation.shape) != square):
            raise ValueError(f"rotation must be {square}, got "
                             f"{None if self.rotation is None else tuple(self.rotation.shape)}")
        if self.bits and (self.centroids is None or self.centroids.numel() != 2 ** self.bits):
            raise ValueError(f"a {self.bits}-bit codebook has {2 ** self.bits} centroids, got "
                             f"{None if self.centroids is None else self.centroids.numel()}")
        if self.sketch is not None and tuple(self.sketch.shape) != square:
            raise ValueError(f"sketch must be {square}, got {tuple(self.sketch.shape)}")

    @property
    def qjl_scale(self) -> float:
        """gamma = sqrt(pi/2) / m, the QJL dequantization constant (Definition 1)."""
        return math.sqrt(math.pi / 2) / self.dim


def _stream_columns(matrix: torch.Tensor, codes_per_group: int, groups_padded: int) -> torch.Tensor:
    """(m_in, cpg * groups_padded) float32 with column ``k * groups_padded + g`` = row ``g * cpg + k`` of ``matrix``
    (zero past its rows): ``x @ result`` is ``matrix @ x`` in stream order (``scores.stream_queries``)."""
    rows, cols = matrix.shape
    padded = matrix.new_zeros(groups_padded * codes_per_group, cols, dtype=torch.float32)
    padded[:rows] = matrix
    return padded.view(groups_padded, codes_per_group, cols).transpose(0, 1).reshape(-1, cols).T


@dataclass(frozen=True, eq=False)
class CacheFormat:
    """The constants of a packed K/V cache that the kernel needs, derived once (:meth:`build`).

    ``query_map`` (head_dim, L) float32 maps the query in key channel order to every key stage's query in stream
    order; ``value_rotation`` (head_dim, head_dim) is ``blockdiag(Pi_V0, Pi_V1)`` (``o_P = o_rot @ it``); ``tables``
    are the fp16 codebooks; ``meta`` the kernel's compile-time geometry.
    """

    key_groups: tuple[ChannelGroup, ...]
    value_groups: tuple[ChannelGroup, ...]
    query_map: torch.Tensor
    key_tables: tuple[torch.Tensor, ...]
    value_tables: tuple[torch.Tensor, ...]
    value_rotation: torch.Tensor
    meta: dict[str, Any]

    @property
    def head_dim(self) -> int:
        return sum(group.dim for group in self.key_groups)

    @classmethod
    def build(cls, key_groups: Sequence[ChannelGroup], value_groups: Sequence[ChannelGroup],
              device: torch.device | str) -> CacheFormat:
        """The format of a cache whose keys / values are ``key_groups`` / ``value_groups`` (outliers first)."""
        key_groups, value_groups = tuple(key_groups), tuple(value_groups)
        for name, groups in (("key", key_groups), ("value", value_groups)):
            if not 1 <= len(groups) <= MAX_CHANNEL_GROUPS:
                raise ValueError(f"{name}s must be 1 to {MAX_CHANNEL_GROUPS} channel groups, got {len(groups)}")
        if any(group.sketch is not None or group.bits == 0 for group in value_groups):
            raise ValueError("values are TurboQuant_mse (no QJL stage, bits >= 1)")
        key_dims, value_dims = [g.dim for g in key_groups], [g.dim for g in value_groups]
        if sum(key_dims) != sum(value_dims):
            raise ValueError(f"key groups cover {sum(key_dims)} channels, value groups {sum(value_dims)}")
        device = torch.device(device)
        meta: dict[str, Any] = {"K_SPLIT": len(key_groups) == 2, "V_SPLIT": len(value_groups) == 2}
        blocks, query_offset = [], 0
        for part in range(MAX_CHANNEL_GROUPS):
            if part < len(key_groups):
                geometry = _key_geometry(key_groups[part], query_offset)
                blocks.append(_key_stage_columns(key_groups[part], geometry, device))
                query_offset += blocks[-1].shape[1]
            else:
                geometry = _ABSENT_KEY_GROUP
            meta.update({f"K{part}_{name}": value for name, value in geometry.items()})
            geometry = (_value_geometry(value_groups[part], sum(value_dims[:part])) if part < len(value_groups)
                        else _ABSENT_VALUE_GROUP)
            meta.update({f"V{part}_{name}": value for name, value in geometry.items()})

        def table(group: ChannelGroup) -> torch.Tensor:
            centroids = group.centroids if group.bits else torch.zeros(1)  # QJL alone: no table is read
            return centroids.to(device=device, dtype=torch.float16).contiguous()

        value_rotation = _block_diag([g.rotation.to(device, torch.float32) for g in value_groups]).contiguous()
        return cls(key_groups, value_groups, _block_diag(blocks), tuple(map(table, key_groups)),
                   tuple(map(table, value_groups)), value_rotation, meta)


def _block_diag(blocks: list[torch.Tensor]) -> torch.Tensor:
    """``torch.block_diag``, without a copy for one block (``decode_attention_triton`` builds a format per call)."""
    return blocks[0] if len(blocks) == 1 else torch.block_diag(*blocks)


def _key_geometry(group: ChannelGroup, query_offset: int) -> dict[str, Any]:
    """Constexprs of one key group: MSE code geometry (``_layout``; none at 0 bits), QJL sign groups (1-bit codes)
    and where its stages' queries start in the query row."""
    bpg, cpg = group_geometry(group.bits) if group.bits else (1, 1)
    groups = pow2_at_least(num_groups(group.dim, group.bits), floor=1) if group.bits else 1
    return {"BITS": group.bits, "BPG": bpg, "CPG": cpg, "GROUPS": groups, "QJL": group.sketch is not None,
            "SIGN_GROUPS": pow2_at_least(num_groups(group.dim, 1), floor=1), "Q_OFF": query_offset,
            "QJL_Q_OFF": query_offset + (cpg * groups if group.bits else 0)}


def _key_stage_columns(group: ChannelGroup, geometry: dict[str, Any], device: torch.device) -> torch.Tensor:
    """(dim, L_g) float32: the group's stage queries in stream order are ``q_g @ this`` (``Pi_g``, ``gamma_g S_g``)."""
    columns = []
    if group.bits:
        columns.append(_stream_columns(group.rotation.to(device), geometry["CPG"], geometry["GROUPS"]))
    if group.sketch is not None:
        columns.append(_stream_columns(group.qjl_scale * group.sketch.to(device, torch.float32), 8,
                                       geometry["SIGN_GROUPS"]))
    return columns[0] if len(columns) == 1 else torch.cat(columns, dim=1)


def _value_geometry(group: ChannelGroup, channel_offset: int) -> dict[str, Any]:
    """Constexprs of one value group: code geometry, channels and first channel of its rotated output."""
    bpg, cpg = group_geometry(group.bits)
    return {"BITS": group.bits, "BPG": bpg, "CPG": cpg, "GROUPS": pow2_at_least(num_groups(group.dim, group.bits)),
            "DIM": group.dim, "OFF": channel_offset}


# constexprs of an absent second channel group (never read: K_SPLIT / V_SPLIT are False)
_ABSENT_KEY_GROUP = {"BITS": 0, "BPG": 1, "CPG": 1, "GROUPS": 1, "QJL": False, "SIGN_GROUPS": 1, "Q_OFF": 0,
                     "QJL_Q_OFF": 0}
_ABSENT_VALUE_GROUP = {"BITS": 1, "BPG": 1, "CPG": 8, "GROUPS": 16, "DIM": 0, "OFF": 0}


# ------------------------------------------------------------------------------------------ kernels
@triton.jit
def _code_values(words, shift, table_ptr, BITS: tl.constexpr, SIGNS: tl.constexpr, LOOKUP: tl.constexpr):
    """fp16 values of the ``BITS``-bit codes at bit ``shift`` of ``words``: ``table[code]``, or -1 / +1 for QJL sign
    bits (``SIGNS``, no table); ``LOOKUP=False`` gives the raw code (benchmark attribution only, wrong values)."""
    codes = (words >> shift) & ((1 << BITS) - 1)
    if SIGNS:
        values = (codes * 2 - 1).to(tl.float16)
    elif LOOKUP:
        values = tl.load(table_ptr + codes)
    else:
        values = codes.to(tl.float16)
    return values


@triton.jit
def _stage_scores(rows, tok_mask, row_bytes, q_cols, head_mask, table_ptr,
                  BITS: tl.constexpr, BPG: tl.constexpr, CPG: tl.constexpr, GROUPS: tl.constexpr,
                  BLOCK_M: tl.constexpr, SIGNS: tl.constexpr, LOOKUP: tl.constexpr):
    """(tokens, heads) fp32 ``<q_stage, table[code]>`` for the packed rows at ``rows``; ``q_cols`` points at the
    stage's query in stream order (position ``k * GROUPS + g`` = code k of group g).

    With at least 16 code groups: one ``tl.dot`` per code position k (K = GROUPS). A smaller stage (the outlier
    group: 32 channels of 3-bit codes or of sign bits are 4 groups) packs ``16 // GROUPS`` code positions into the
    16 columns a ``tl.dot`` needs (column c: position k0 + c // GROUPS of group c % GROUPS, the same stream order),
    rather than padding every position to 16 groups."""
    acc = tl.zeros((rows.shape[0], BLOCK_M), dtype=tl.float32)
    if GROUPS >= 16:
        g_offs = tl.arange(0, GROUPS)
        words = load_group_words(rows, tok_mask, g_offs, row_bytes, BPG)
        for k in tl.static_range(CPG):
            q_t = tl.load(q_cols + (k * GROUPS + g_offs)[:, None], mask=head_mask[None, :], other=0.0)
            acc = tl.dot(_code_values(words, BITS * k, table_ptr, BITS, SIGNS, LOOKUP), q_t, acc)
    else:
        cols = tl.arange(0, 16)
        words = load_group_words(rows, tok_mask, cols % GROUPS, row_bytes, BPG)
        for k0 in tl.static_range(0, CPG, 16 // GROUPS):
            position = k0 + cols // GROUPS
            live = position < CPG  # past the last code position when CPG * GROUPS < 16
            q_t = tl.load(q_cols + (k0 * GROUPS + cols)[:, None], mask=head_mask[None, :] & live[:, None],
                          other=0.0)
            shift = (BITS * tl.where(live, position, 0))[None, :]
            acc = tl.dot(_code_values(words, shift, table_ptr, BITS, SIGNS, LOOKUP), q_t, acc)
    return acc


@triton.jit
def _key_group_logits(codes, norms, signs, residual_norms, table, code_bytes, sign_bytes, stride_cn, stride_sn,
                      toks, tok_mask, q_cols, head_mask, scale,
                      BITS: tl.constexpr, BPG: tl.constexpr, CPG: tl.constexpr, GROUPS: tl.constexpr,
                      QJL: tl.constexpr, SIGN_GROUPS: tl.constexpr, Q_OFF: tl.constexpr, QJL_Q_OFF: tl.constexpr,
                      BLOCK_M: tl.constexpr, LOOKUP: tl.constexpr):
    """One key group's share of the tile's logits, (tokens, heads) fp32:
    ``scale * n_t * (<Pi q_g, c[idx_t]> + rho_t <gamma S q_g, z_t>)`` (the QJL term only with ``QJL``)."""
    rows = toks.to(tl.int64)
    if BITS > 0:
        unit = _stage_scores(codes + rows * stride_cn, tok_mask, code_bytes, q_cols + Q_OFF, head_mask, table,
                             BITS, BPG, CPG, GROUPS, BLOCK_M, False, LOOKUP)
    else:
        unit = tl.zeros((toks.shape[0], BLOCK_M), dtype=tl.float32)
    if QJL:
        rho = tl.load(residual_norms + toks, mask=tok_mask, other=0.0).to(tl.float32)
        unit += rho[:, None] * _stage_scores(signs + rows * stride_sn, tok_mask, sign_bytes, q_cols + QJL_Q_OFF,
                                             head_mask, table, 1, 1, 8, SIGN_GROUPS, BLOCK_M, True, LOOKUP)
    norm = tl.load(norms + toks, mask=tok_mask, other=0.0).to(tl.float32)
    return unit * (norm * scale)[:, None]


@triton.jit
def _value_accumulators(BLOCK_M: tl.constexpr, CPG: tl.constexpr, GROUPS: tl.constexpr):
    """Zero accumulators of one value group: 4-bit values keep even and odd coordinates apart ((heads, groups)
    each); other widths one (heads, CPG * groups) tile in stream order and an unused (heads, 1) placeholder."""
    if CPG == 2:
        acc_a = tl.zeros((BLOCK_M, GROUPS), dtype=tl.float32)
        acc_b = tl.zeros((BLOCK_M, GROUPS), dtype=tl.float32)
    else:
        acc_a = tl.zeros((BLOCK_M, CPG * GROUPS), dtype=tl.float32)
        acc_b = tl.zeros((BLOCK_M, 1), dtype=tl.float32)
    return acc_a, acc_b


@triton.jit
def _accumulate_values(acc_a, acc_b, p, alpha, codes, norms, table, code_bytes, stride_cn, toks, tok_mask,
                       BITS: tl.constexpr, BPG: tl.constexpr, CPG: tl.constexpr, GROUPS: tl.constexpr,
                       LOOKUP: tl.constexpr):
    """``acc <- alpha * acc + sum_t p_t n_t c[idx_t]`` for one value group over the tile (its rotated domain)."""
    norm = tl.load(norms + toks, mask=tok_mask, other=0.0).to(tl.float32)
    p_t = tl.trans((p * norm[:, None]).to(tl.float16))
    words = load_group_words(codes + toks.to(tl.int64) * stride_cn, tok_mask, tl.arange(0, GROUPS), code_bytes, BPG)
    if CPG == 2:
        acc_a = tl.dot(p_t, decode_codes(words, table, 0, BITS, LOOKUP), acc_a * alpha[:, None])
        acc_b = tl.dot(p_t, decode_codes(words, table, 1, BITS, LOOKUP), acc_b * alpha[:, None])
    else:
        stream = words_to_stream_codes(words, BITS, CPG)
        if LOOKUP:
            values = tl.load(table + stream)
        else:
            values = stream.to(tl.float16)
        acc_a = tl.dot(p_t, values, acc_a * alpha[:, None])
    return acc_a, acc_b


@triton.jit
def _store_values(part, acc_a, acc_b, inv_l, head_mask,
                  CPG: tl.constexpr, GROUPS: tl.constexpr, DIM: tl.constexpr, OFF: tl.constexpr):
    """Write one value group's normalized accumulator to its channels ``OFF .. OFF + DIM - 1`` of the split's row."""
    g_offs = tl.arange(0, GROUPS)
    if CPG == 2:
        even = 2 * g_offs
        tl.store(part + OFF + even[None, :], acc_a * inv_l[:, None], mask=head_mask[:, None] & (even < DIM)[None, :])
        tl.store(part + OFF + even[None, :] + 1, acc_b * inv_l[:, None],
                 mask=head_mask[:, None] & (even + 1 < DIM)[None, :])
    else:
        coords = stream_coordinates(g_offs, CPG)
        tl.store(part + OFF + coords[None, :], acc_a * inv_l[:, None],
                 mask=head_mask[:, None] & (coords < DIM)[None, :])


@triton.jit
def _decode_split_kernel(
    q_ptr, seq_lens_ptr, part_out_ptr, part_lse_ptr,
    k0_codes, k0_norms, k0_signs, k0_rnorms, k0_table, k0_code_bytes, k0_sign_bytes,
    k0_scb, k0_sch, k0_scn, k0_snb, k0_snh, k0_ssb, k0_ssh, k0_ssn, k0_srb, k0_srh,
    k1_codes, k1_norms, k1_signs, k1_rnorms, k1_table, k1_code_bytes, k1_sign_bytes,
    k1_scb, k1_sch, k1_scn, k1_snb, k1_snh, k1_ssb, k1_ssh, k1_ssn, k1_srb, k1_srh,
    v0_codes, v0_norms, v0_table, v0_code_bytes, v0_scb, v0_sch, v0_scn, v0_snb, v0_snh,
    v1_codes, v1_norms, v1_table, v1_code_bytes, v1_scb, v1_sch, v1_scn, v1_snb, v1_snh,
    tokens_per_split, stride_qb, stride_qh, stride_pb, stride_ph, stride_ps, stride_lb, stride_lh,
    scale_log2,
    GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, LOOKUP: tl.constexpr,
    K_SPLIT: tl.constexpr, V_SPLIT: tl.constexpr,
    K0_BITS: tl.constexpr, K0_BPG: tl.constexpr, K0_CPG: tl.constexpr, K0_GROUPS: tl.constexpr,
    K0_QJL: tl.constexpr, K0_SIGN_GROUPS: tl.constexpr, K0_Q_OFF: tl.constexpr, K0_QJL_Q_OFF: tl.constexpr,
    K1_BITS: tl.constexpr, K1_BPG: tl.constexpr, K1_CPG: tl.constexpr, K1_GROUPS: tl.constexpr,
    K1_QJL: tl.constexpr, K1_SIGN_GROUPS: tl.constexpr, K1_Q_OFF: tl.constexpr, K1_QJL_Q_OFF: tl.constexpr,
    V0_BITS: tl.constexpr, V0_BPG: tl.constexpr, V0_CPG: tl.constexpr, V0_GROUPS: tl.constexpr,
    V0_DIM: tl.constexpr, V0_OFF: tl.constexpr,
    V1_BITS: tl.constexpr, V1_BPG: tl.constexpr, V1_CPG: tl.constexpr, V1_GROUPS: tl.constexpr,
    V1_DIM: tl.constexpr, V1_OFF: tl.constexpr,
):
    """One (batch row, KV head, split). Logits are kept transposed, (tokens, heads), so decoded keys are the
    A operand of tl.dot; ``q_ptr`` holds every key stage's query in stream order (:attr:`CacheFormat.query_map`).
    Arguments ``k{g}_*`` / ``v{g}_*`` are key / value channel group g (codes, norms, QJL signs and residual
    norms, table, row bytes, strides); group 1 and the QJL stages are read only under their constexpr flags."""
    b = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + b)
    start = split * tokens_per_split
    end = tl.minimum(start + tokens_per_split, seq_len)

    head_offs = tl.arange(0, BLOCK_M)
    head_mask = head_offs < GROUP
    heads = kv_head * GROUP + head_offs
    q_cols = q_ptr + b * stride_qb + heads[None, :] * stride_qh

    k0_codes += b * k0_scb + kv_head * k0_sch
    k0_norms += b * k0_snb + kv_head * k0_snh
    k0_signs += b * k0_ssb + kv_head * k0_ssh
    k0_rnorms += b * k0_srb + kv_head * k0_srh
    k1_codes += b * k1_scb + kv_head * k1_sch
    k1_norms += b * k1_snb + kv_head * k1_snh
    k1_signs += b * k1_ssb + kv_head * k1_ssh
    k1_rnorms += b * k1_srb + kv_head * k1_srh
    v0_codes += b * v0_scb + kv_head * v0_sch
    v0_norms += b * v0_snb + kv_head * v0_snh
    v1_codes += b * v1_scb + kv_head * v1_sch
    v1_norms += b * v1_snb + kv_head * v1_snh

    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc0_a, acc0_b = _value_accumulators(BLOCK_M, V0_CPG, V0_GROUPS)
    if V_SPLIT:
        acc1_a, acc1_b = _value_accumulators(BLOCK_M, V1_CPG, V1_GROUPS)
    for n0 in range(start, end, BLOCK_N):
        toks = n0 + tl.arange(0, BLOCK_N)
        tok_mask = toks < end
        logits = _key_group_logits(k0_codes, k0_norms, k0_signs, k0_rnorms, k0_table, k0_code_bytes, k0_sign_bytes,
                                   k0_scn, k0_ssn, toks, tok_mask, q_cols, head_mask, scale_log2,
                                   K0_BITS, K0_BPG, K0_CPG, K0_GROUPS, K0_QJL, K0_SIGN_GROUPS, K0_Q_OFF,
                                   K0_QJL_Q_OFF, BLOCK_M, LOOKUP)
        if K_SPLIT:
            logits += _key_group_logits(k1_codes, k1_norms, k1_signs, k1_rnorms, k1_table, k1_code_bytes,
                                        k1_sign_bytes, k1_scn, k1_ssn, toks, tok_mask, q_cols, head_mask, scale_log2,
                                        K1_BITS, K1_BPG, K1_CPG, K1_GROUPS, K1_QJL, K1_SIGN_GROUPS, K1_Q_OFF,
                                        K1_QJL_Q_OFF, BLOCK_M, LOOKUP)
        logits = tl.where(tok_mask[:, None], logits, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(logits, axis=0))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(logits - m_new[None, :])
        l_i = l_i * alpha + tl.sum(p, axis=0)
        acc0_a, acc0_b = _accumulate_values(acc0_a, acc0_b, p, alpha, v0_codes, v0_norms, v0_table, v0_code_bytes,
                                            v0_scn, toks, tok_mask, V0_BITS, V0_BPG, V0_CPG, V0_GROUPS, LOOKUP)
        if V_SPLIT:
            acc1_a, acc1_b = _accumulate_values(acc1_a, acc1_b, p, alpha, v1_codes, v1_norms, v1_table,
                                                v1_code_bytes, v1_scn, toks, tok_mask, V1_BITS, V1_BPG, V1_CPG,
                                                V1_GROUPS, LOOKUP)
        m_i = m_new

    has_tokens = l_i > 0
    inv_l = 1.0 / tl.where(has_tokens, l_i, 1.0)
    lse = tl.where(has_tokens, m_i + tl.log2(tl.where(has_tokens, l_i, 1.0)), float("-inf"))
    part = part_out_ptr + b * stride_pb + heads[:, None] * stride_ph + split * stride_ps
    _store_values(part, acc0_a, acc0_b, inv_l, head_mask, V0_CPG, V0_GROUPS, V0_DIM, V0_OFF)
    if V_SPLIT:
        _store_values(part, acc1_a, acc1_b, inv_l, head_mask, V1_CPG, V1_GROUPS, V1_DIM, V1_OFF)
    tl.store(part_lse_ptr + b * stride_lb + heads * stride_lh + split, lse, mask=head_mask)


@triton.jit
def _combine_kernel(
    part_out_ptr, part_lse_ptr, rot_ptr, perm_ptr, out_ptr, lse_ptr,
    n_heads, n_splits, dim,
    stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_ob, stride_oh, stride_eb, stride_mb, stride_mh,
    GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_J: tl.constexpr,
    WRITE_LSE: tl.constexpr, PERMUTED: tl.constexpr,
):
    """Merge the splits of (batch row, block of heads) by their log-sum-exp, rotate back with the block-diagonal
    Pi_V^T and, when ``PERMUTED``, scatter channel j to ``perm_V[b, kv_head, j]``; with WRITE_LSE also store the
    natural log-sum-exp of the scaled logits over all splits (-inf for no tokens)."""
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
        out_mask = head_mask[:, None] & (j_offs < dim)[None, :]
        if PERMUTED:
            channels = tl.load(perm_ptr + b * stride_mb + (heads // GROUP)[:, None] * stride_mh + j_offs[None, :],
                               mask=out_mask, other=0)
        else:
            channels = j_offs[None, :]
        tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + channels,
                 o.to(out_ptr.dtype.element_ty), mask=out_mask)


# ------------------------------------------------------------------------------------------ host entry points
def _check_stream(name: str, fields: Sequence[GroupFields], groups: Sequence[ChannelGroup], batch: int) -> None:
    if len(fields) != len(groups):
        raise ValueError(f"{name}: {len(fields)} channel groups of fields for a format of {len(groups)}")
    for part, (field, group) in enumerate(zip(fields, groups)):
        label = f"{name} group {part}"
        if field.codes.ndim != 4 or field.codes.dtype != torch.uint8:
            raise ValueError(f"{label}: codes must be uint8 (batch, kv_heads, tokens, row_bytes), got "
                             f"{field.codes.dtype} {tuple(field.codes.shape)}")
        if field.codes.shape[-1] != packed_row_bytes(group.dim, group.bits):
            raise ValueError(f"{label}: code rows must hold {packed_row_bytes(group.dim, group.bits)} bytes "
                             f"(dim={group.dim}, bits={group.bits}), got {field.codes.shape[-1]}")
        lead = tuple(field.codes.shape[:3])
        if tuple(field.norms.shape) != lead:
            raise ValueError(f"{label}: norms must be {lead}, got {tuple(field.norms.shape)}")
        if (field.signs is None) != (group.sketch is None) or (field.residual_norms is None) != (group.sketch is None):
            raise ValueError(f"{label}: QJL signs and residual norms are given exactly when the group has a sketch")
        if field.signs is not None:
            if field.signs.dtype != torch.uint8 or tuple(field.signs.shape) != (*lead, packed_row_bytes(group.dim, 1)):
                raise ValueError(f"{label}: signs must be uint8 {(*lead, packed_row_bytes(group.dim, 1))}, got "
                                 f"{field.signs.dtype} {tuple(field.signs.shape)}")
            if tuple(field.residual_norms.shape) != lead:
                raise ValueError(f"{label}: residual_norms must be {lead}, got {tuple(field.residual_norms.shape)}")
        if lead[0] != batch:
            raise ValueError(f"{label}: batch {lead[0]} != q batch {batch}")


def _check(q: torch.Tensor, keys: Sequence[GroupFields], values: Sequence[GroupFields], seq_lens: torch.Tensor,
           cache_format: CacheFormat, key_permutation: torch.Tensor | None,
           value_permutation: torch.Tensor | None) -> None:
    if q.ndim != 3:
        raise ValueError(f"q must be (batch, query_heads, head_dim), got {tuple(q.shape)}")
    batch, n_heads, dim = q.shape
    if dim != cache_format.head_dim:
        raise ValueError(f"q head_dim {dim} != the format's {cache_format.head_dim} channels")
    _check_stream("keys", keys, cache_format.key_groups, batch)
    _check_stream("values", values, cache_format.value_groups, batch)
    shapes = {tuple(field.codes.shape[:3]) for field in (*keys, *values)}
    if len(shapes) != 1:
        raise ValueError(f"k and v caches disagree on (batch, kv_heads, tokens): {sorted(shapes)}")
    n_kv_heads = keys[0].codes.shape[1]
    if n_heads % n_kv_heads:
        raise ValueError(f"query heads ({n_heads}) must be a multiple of KV heads ({n_kv_heads})")
    if seq_lens.shape != (batch,) or seq_lens.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"seq_lens must be an int32/int64 tensor of shape ({batch},), got "
                         f"{seq_lens.dtype} {tuple(seq_lens.shape)}")
    for name, perm in (("key_permutation", key_permutation), ("value_permutation", value_permutation)):
        if perm is not None and (tuple(perm.shape) != (batch, n_kv_heads, dim) or perm.is_floating_point()):
            raise ValueError(f"{name} must be an integer tensor {(batch, n_kv_heads, dim)}, got "
                             f"{perm.dtype} {tuple(perm.shape)}")


def default_block_n(cache_format: CacheFormat) -> int:
    """Tokens per tile: 64, or 128 when a stream is split into two channel groups. Measured on one H200 at
    B = 8, 32K (``results/kernels/session3/sweep_split.txt``, 4 warps): one group 546 / 422 / 470 µs at
    32 / 64 / 128 tokens; the 3.5-bit split 938 / 878 / 722 µs, with prod keys 1417 / 1028 / 963 µs (the two
    groups' per-tile work amortises over longer tiles)."""
    return 128 if cache_format.meta["K_SPLIT"] or cache_format.meta["V_SPLIT"] else 64


def default_num_splits(batch: int, n_kv_heads: int, max_tokens: int, device: torch.device,
                       block_n: int) -> int:
    """Splits so that about eight programs per SM run (flash-decoding), at least one tile per split.

    Eight rather than four: on the H200 twice the splits ran 5-10% faster at batch 8 (benchmarks/NOTES.md).
    """
    n_sm = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
    wanted = triton.cdiv(8 * n_sm, batch * n_kv_heads)
    return max(1, min(wanted, triton.cdiv(max_tokens, block_n)))


def _row_contiguous(t: torch.Tensor | None) -> torch.Tensor | None:
    return t if t is None or t.stride(-1) == 1 else t.contiguous()


def _key_group_args(field: GroupFields | None, table: torch.Tensor | None, stand_in: GroupFields) -> tuple:
    """``k{g}_*`` kernel arguments of one key group; an absent group or stage passes ``stand_in`` (never read)."""
    field = field or stand_in
    codes, norms = _row_contiguous(field.codes), _row_contiguous(field.norms)
    signs = _row_contiguous(field.signs) if field.signs is not None else codes
    rnorms = _row_contiguous(field.residual_norms) if field.residual_norms is not None else norms
    if codes.shape[-1] == 0:  # QJL alone: no MSE codes (an empty tensor may have no storage to point at)
        codes = signs
    return (codes, norms, signs, rnorms, stand_in.norms if table is None else table, codes.shape[-1],
            signs.shape[-1], *codes.stride()[:3], *norms.stride()[:2], *signs.stride()[:3], *rnorms.stride()[:2])


def _value_group_args(field: GroupFields | None, table: torch.Tensor | None, stand_in: GroupFields) -> tuple:
    """``v{g}_*`` kernel arguments of one value group (``stand_in`` for an absent group, never read)."""
    field = field or stand_in
    codes, norms = _row_contiguous(field.codes), _row_contiguous(field.norms)
    return (codes, norms, stand_in.norms if table is None else table, codes.shape[-1], *codes.stride()[:3],
            *norms.stride()[:2])


def decode_attention_groups_triton(
    q: torch.Tensor,
    keys: Sequence[GroupFields],
    values: Sequence[GroupFields],
    seq_lens: torch.Tensor,
    cache_format: CacheFormat,
    *,
    key_permutation: torch.Tensor | None = None,
    value_permutation: torch.Tensor | None = None,
    scale: float | None = None,
    num_splits: int | None = None,
    block_n: int | None = None,
    num_warps: int = 4,
    num_stages: int = 2,
    lookup: bool = True,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention of one new query token per sequence over a packed cache of channel groups (module docstring).

    Args:
        q: (batch, query_heads, head_dim) queries in the model's channel order (any float dtype; the output
            has it too).
        keys, values: the packed fields of each channel group (outliers first), as ``cache_format`` describes
            them; tensors (batch, kv_heads, tokens, ...) whose token axis may be strided (a slice of a larger
            cache).
        seq_lens: (batch,) number of valid cached tokens per row (<= tokens).
        cache_format: the groups' rotations, codebooks and QJL matrices (:meth:`CacheFormat.build`, once).
        key_permutation, value_permutation: (batch, kv_heads, head_dim) channel order of each stream
            (``x_P = x[perm]``, groups are consecutive in it); None: the identity.
        scale: softmax scale, default 1 / sqrt(head_dim).
        num_splits: KV splits per (row, KV head); default fills the GPU (``default_num_splits``).
        block_n, num_warps, num_stages: tokens per tile, warps per program, pipeline depth (tuning). block_n
            defaults to :func:`default_block_n` (64 for one channel group, 128 for a split).
        lookup: False skips the centroid lookups and returns wrong values (benchmark attribution only).
        return_lse: also return ``log sum_t exp(scale * <q, k~_t>)`` per (row, query head), float32
            (batch, query_heads), ``-inf`` for a row without tokens: what an exact merge with attention over
            other tokens needs (``o = sum_i exp(lse_i - lse) o_i``, ``lse = log sum_i exp(lse_i)``).
    """
    _check(q, keys, values, seq_lens, cache_format, key_permutation, value_permutation)
    check_device(q.device)
    batch, n_heads, dim = q.shape
    n_kv_heads, max_tokens = keys[0].codes.shape[1], keys[0].codes.shape[2]
    group = n_heads // n_kv_heads
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    block_n = block_n or default_block_n(cache_format)
    num_splits = num_splits or default_num_splits(batch, n_kv_heads, max_tokens, q.device, block_n)
    tokens_per_split = triton.cdiv(triton.cdiv(max_tokens, num_splits), block_n) * block_n
    num_splits = triton.cdiv(max_tokens, tokens_per_split) if max_tokens else 1

    q_keyed = q.to(torch.float32)
    if key_permutation is not None:  # q_P: the GQA group of query heads shares its KV head's channel order
        grouped = q_keyed.view(batch, n_kv_heads, group, dim)
        index = key_permutation.to(device=q.device, dtype=torch.int64)[:, :, None].expand(-1, -1, group, -1)
        q_keyed = grouped.gather(-1, index).view(batch, n_heads, dim)
    q_stages = (q_keyed @ cache_format.query_map).to(torch.float16)
    part_out = torch.empty((batch, n_heads, num_splits, dim), dtype=torch.float32, device=q.device)
    part_lse = torch.empty((batch, n_heads, num_splits), dtype=torch.float32, device=q.device)
    stand_in = keys[0]
    k_args = [_key_group_args(keys[g] if g < len(keys) else None,
                              cache_format.key_tables[g] if g < len(keys) else None, stand_in)
              for g in range(MAX_CHANNEL_GROUPS)]
    v_args = [_value_group_args(values[g] if g < len(values) else None,
                                cache_format.value_tables[g] if g < len(values) else None, values[0])
              for g in range(MAX_CHANNEL_GROUPS)]
    _decode_split_kernel[(batch, n_kv_heads, num_splits)](
        q_stages, seq_lens, part_out, part_lse, *k_args[0], *k_args[1], *v_args[0], *v_args[1],
        tokens_per_split, q_stages.stride(0), q_stages.stride(1),
        part_out.stride(0), part_out.stride(1), part_out.stride(2), part_lse.stride(0), part_lse.stride(1),
        scale * math.log2(math.e),
        GROUP=group, BLOCK_M=pow2_at_least(group), BLOCK_N=block_n, LOOKUP=lookup, **cache_format.meta,
        num_warps=num_warps, num_stages=num_stages,
    )
    out = torch.empty((batch, n_heads, dim), dtype=q.dtype, device=q.device)
    lse = torch.empty((batch, n_heads), dtype=torch.float32, device=q.device) if return_lse else part_lse
    perm = part_lse if value_permutation is None else value_permutation.to(q.device)
    combine_m = 16
    _combine_kernel[(batch, triton.cdiv(n_heads, combine_m))](
        part_out, part_lse, cache_format.value_rotation, perm, out, lse,
        n_heads, num_splits, dim,
        part_out.stride(0), part_out.stride(1), part_out.stride(2), part_lse.stride(0), part_lse.stride(1),
        out.stride(0), out.stride(1), lse.stride(0), perm.stride(0), perm.stride(1),
        GROUP=group, BLOCK_M=combine_m, BLOCK_D=pow2_at_least(dim), BLOCK_J=32, WRITE_LSE=return_lse,
        PERMUTED=value_permutation is not None, num_warps=4,
    )
    return (out, lse) if return_lse else out


def _one_group(q: torch.Tensor, k_codes: torch.Tensor, k_norms: torch.Tensor, v_codes: torch.Tensor,
               v_norms: torch.Tensor, k_centroids: torch.Tensor, v_centroids: torch.Tensor, k_bits: int,
               v_bits: int, rotation: torch.Tensor, v_rotation: torch.Tensor | None):
    """The fields and format of a cache with one TurboQuant_mse channel group per stream."""
    if q.ndim != 3:
        raise ValueError(f"q must be (batch, query_heads, head_dim), got {tuple(q.shape)}")
    dim = q.shape[-1]
    v_rotation = rotation if v_rotation is None else v_rotation
    cache_format = CacheFormat.build([ChannelGroup(dim, k_bits, rotation, k_centroids)],
                                     [ChannelGroup(dim, v_bits, v_rotation, v_centroids)], q.device)
    return [GroupFields(k_codes, k_norms)], [GroupFields(v_codes, v_norms)], cache_format


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
    **options: Any,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """:func:`decode_attention_groups_triton` for a TurboQuant_mse cache of one channel group per stream.

    Args:
        q: (batch, query_heads, head_dim) unrotated queries.
        k_codes, v_codes: uint8 (batch, kv_heads, tokens, ceil(head_dim * bits / 8)), the library's packed layout.
        k_norms, v_norms: (batch, kv_heads, tokens) float16/float32 norms of the cached vectors.
        seq_lens: (batch,) number of valid cached tokens per row (<= tokens).
        k_centroids, v_centroids: 2^bits centroids of the key / value codebooks; k_bits, v_bits their widths.
        rotation: dense Pi_K (head_dim, head_dim), y = Pi x; v_rotation: Pi_V (default Pi_K).
        options: ``scale``, ``num_splits``, ``block_n``, ``num_warps``, ``num_stages``, ``lookup``, ``return_lse``
            of :func:`decode_attention_groups_triton`.
    """
    keys, values, cache_format = _one_group(q, k_codes, k_norms, v_codes, v_norms, k_centroids, v_centroids,
                                            k_bits, v_bits, rotation, v_rotation)
    return decode_attention_groups_triton(q, keys, values, seq_lens, cache_format, **options)


# ------------------------------------------------------------------------------------------ float64 reference
def dequantize_group_reference(field: GroupFields, group: ChannelGroup) -> torch.Tensor:
    """Float64 ``n (Pi^T c[idx] + gamma rho S^T z)`` (the QJL term for a group with a sketch): (..., dim)."""
    from turboquant.packing import unpack_codes

    unit = torch.zeros(*field.norms.shape, group.dim, dtype=torch.float64, device=field.norms.device)
    if group.bits:
        rotated = group.centroids.to(torch.float64)[unpack_codes(field.codes, group.bits, group.dim).long()]
        unit = unit + rotated @ group.rotation.to(torch.float64)
    if group.sketch is not None:
        signs = unpack_codes(field.signs, 1, group.dim).to(torch.float64) * 2 - 1
        unit = unit + group.qjl_scale * field.residual_norms.to(torch.float64)[..., None] * (
            signs @ group.sketch.to(torch.float64))
    return field.norms.to(torch.float64)[..., None] * unit


def dequantize_stream_reference(fields: Sequence[GroupFields], groups: Sequence[ChannelGroup],
                                permutation: torch.Tensor | None = None) -> torch.Tensor:
    """Float64 vectors (batch, kv_heads, tokens, head_dim) in the model's channel order: the groups concatenated
    (``x_P``), then ``x[perm[j]] = x_P[j]``."""
    permuted = torch.cat([dequantize_group_reference(f, g) for f, g in zip(fields, groups)], dim=-1)
    if permutation is None:
        return permuted
    index = permutation.to(device=permuted.device, dtype=torch.int64)[:, :, None].expand_as(permuted)
    return torch.empty_like(permuted).scatter_(-1, index, permuted)


def decode_attention_groups_reference(
    q: torch.Tensor, keys: Sequence[GroupFields], values: Sequence[GroupFields], seq_lens: torch.Tensor,
    cache_format: CacheFormat, *, key_permutation: torch.Tensor | None = None,
    value_permutation: torch.Tensor | None = None, scale: float | None = None, return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Float64 attention over the dequantized cache (rows masked past ``seq_lens``): (batch, heads, dim), and the
    log-sum-exp of the scaled logits with ``return_lse``. Reads only the format's groups, not its derived maps."""
    _check(q, keys, values, seq_lens, cache_format, key_permutation, value_permutation)
    _batch, n_heads, dim = q.shape
    group = n_heads // keys[0].codes.shape[1]
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    k = dequantize_stream_reference(keys, cache_format.key_groups, key_permutation).repeat_interleave(group, dim=1)
    v = dequantize_stream_reference(values, cache_format.value_groups, value_permutation)
    v = v.repeat_interleave(group, dim=1)
    logits = scale * torch.einsum("bhd,bhtd->bht", q.to(torch.float64), k)
    valid = torch.arange(k.shape[2], device=q.device)[None, :] < seq_lens.to(q.device)[:, None]
    logits = logits.masked_fill(~valid[:, None, :], float("-inf"))
    out = torch.einsum("bht,bhtd->bhd", torch.softmax(logits, dim=-1).nan_to_num(0.0), v)
    return (out, torch.logsumexp(logits, dim=-1)) if return_lse else out


def decode_attention_reference(
    q: torch.Tensor, k_codes: torch.Tensor, k_norms: torch.Tensor, v_codes: torch.Tensor,
    v_norms: torch.Tensor, seq_lens: torch.Tensor, *, k_centroids: torch.Tensor, v_centroids: torch.Tensor,
    k_bits: int, v_bits: int, rotation: torch.Tensor, v_rotation: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """Float64 reference of :func:`decode_attention_triton` (one TurboQuant_mse group per stream)."""
    keys, values, cache_format = _one_group(q, k_codes, k_norms, v_codes, v_norms, k_centroids, v_centroids,
                                            k_bits, v_bits, rotation, v_rotation)
    return decode_attention_groups_reference(q, keys, values, seq_lens, cache_format, scale=scale)
