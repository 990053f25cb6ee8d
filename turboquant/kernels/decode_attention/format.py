"""Host-side description of a TurboQuant-packed K/V cache for the decode kernel: how each channel group was
quantized (:class:`ChannelGroup`; its stored codes are the library's :class:`~turboquant.QuantizedVectors`, token
axis at dim 2), the constants the kernel derives from them once (:class:`CacheFormat`), and the input checks shared
by the kernel and its reference.
The math is in the package docstring (:mod:`turboquant.kernels.decode_attention`)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, NamedTuple

import torch

from ...codebook import host_codebook, symmetric_codebook
from ...codes import QuantizedVectors
from ...packing import packed_size
from .._decode import pair_lut_table, prmt_byte_tables
from .._layout import KERNEL_BITS, group_geometry, num_groups, pow2_at_least

MAX_CHANNEL_GROUPS = 2
MMA_HEAD_DIM = 128  # the one row width the register-operand kernel lays out (turboquant.kernels._mma)
MMA_MAX_GROUP = 16  # its query heads per KV head: the MMA's N, 8 or 16


@dataclass(frozen=True, eq=False)
class ChannelGroup:
    """How one channel group was quantized: ``bits``-bit TurboQuant_mse with rotation ``Pi`` (dense, y = Pi x) and
    codebook centroids ``c``; with ``sketch`` (QJL's S) and its dequantization constant ``qjl_scale`` (gamma =
    sqrt(pi/2) / m, Definition 1, as the quantizer's QJL stage gives it) also the QJL stage of TurboQuant_prod, whose
    MSE stage is then the ``bits``-bit one (0: QJL alone, no rotation or codebook)."""

    dim: int
    bits: int
    rotation: torch.Tensor | None = None
    centroids: torch.Tensor | None = None
    sketch: torch.Tensor | None = None
    qjl_scale: float | None = None

    def __post_init__(self) -> None:
        if self.bits not in (0, *KERNEL_BITS):
            raise ValueError(f"the decode kernel reads MSE codes of {KERNEL_BITS[0]}-{KERNEL_BITS[-1]} bits "
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
        if (self.sketch is None) != (self.qjl_scale is None):
            raise ValueError("a QJL sketch goes with its qjl_scale (and a qjl_scale with a sketch)")

    def packed(self, codes: torch.Tensor, norms: torch.Tensor, qjl_signs: torch.Tensor | None = None,
               residual_norms: torch.Tensor | None = None) -> QuantizedVectors:
        """Packed tensors of this group (``codes`` uint8 (..., ceil(dim * bits / 8)), ``norms`` float16/float32,
        with a sketch ``qjl_signs`` uint8 (..., ceil(dim / 8)) and ``residual_norms``) as the
        :class:`~turboquant.QuantizedVectors` the kernel reads, for codes that no quantizer object made (the
        benchmarks' random codes, a foreign store); a quantizer's own codes come from its ``stored``."""
        qjl = self.sketch is not None
        return QuantizedVectors(codes=codes, norms=norms, qjl_signs=qjl_signs, residual_norms=residual_norms,
                                dim=self.dim, bits=self.bits + qjl, mse_bits=self.bits,
                                signature=f"decode-kernel channel group (dim={self.dim}, bits={self.bits}, qjl={qjl})",
                                dtype=torch.float32)


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
    are the fp16 codebooks; ``meta`` the kernel's compile-time geometry: ``K_SPLIT`` / ``V_SPLIT`` (two channel
    groups) and ``K0``, ``K1``, ``V0``, ``V1``, each group's :class:`KeyGeometry` / :class:`ValueGeometry` as a tuple.
    """

    key_groups: tuple[ChannelGroup, ...]
    value_groups: tuple[ChannelGroup, ...]
    query_map: torch.Tensor
    key_tables: tuple[torch.Tensor, ...]
    value_tables: tuple[torch.Tensor, ...]
    value_rotation: torch.Tensor
    meta: dict[str, Any]

    @cached_property
    def symmetric(self) -> bool:
        """Every codebook sorted and symmetric, so the register decoders apply (``_decode``): read back from the
        device on first use only (a format built once serves every later launch and CUDA-graph replay)."""
        return all(symmetric_codebook(table) for table in (*self.key_tables, *self.value_tables))

    @property
    def mma_split(self) -> bool:
        """Both streams split as the 3.5-bit preset splits them (:data:`turboquant.kernels._mma.SPLIT_LAYOUT`: 32
        outlier channels at 4 bits, 96 at 3), the split layout the register-operand kernel reads."""
        from .._mma import SPLIT_LAYOUT

        return all(tuple((g.dim, g.bits) for g in groups) == SPLIT_LAYOUT
                   for groups in (self.key_groups, self.value_groups))

    def mma_unsupported(self, n_heads: int, n_kv_heads: int) -> str | None:
        """Why the register-operand kernel (:mod:`.mma`) cannot read this format with this GQA shape, or None: it
        reads TurboQuant_mse keys and values of :data:`MMA_HEAD_DIM` channels with symmetric codebooks, one 3- or
        4-bit channel group per stream or both streams split as the 3.5-bit preset (32 outlier channels at 4 bits,
        96 at 3), GQA groups of at most :data:`MMA_MAX_GROUP` query heads."""
        groups = (*self.key_groups, *self.value_groups)
        if any(g.sketch is not None for g in groups):
            return "the register-operand kernel reads TurboQuant_mse keys (no QJL stage)"
        if self.head_dim != MMA_HEAD_DIM:
            return f"the register-operand kernel reads head_dim {MMA_HEAD_DIM}, not {self.head_dim}"
        if len(self.key_groups) == 1 and len(self.value_groups) == 1:
            if any(g.bits not in (3, 4) for g in groups):
                return "the register-operand kernel reads 3- and 4-bit TurboQuant_mse keys and values"
        elif not self.mma_split:
            return ("the register-operand kernel reads one channel group per stream, or both streams split into "
                    "32 outlier channels at 4 bits and 96 at 3 (the 3.5-bit preset)")
        if n_heads // n_kv_heads > MMA_MAX_GROUP:
            return f"the register-operand kernel serves GQA groups of at most {MMA_MAX_GROUP} query heads"
        if not self.symmetric:
            return "the register-operand kernel decodes symmetric (Lloyd-Max) codebooks"
        return None

    @cached_property
    def mma_query_map(self) -> torch.Tensor:
        """(head_dim, head_dim) float32: ``q_P @ this`` is the rotated query ``blockdiag(Pi_0, Pi_1) q`` in the
        register-operand kernel's key order (:func:`.mma.key_channel_order`)."""
        from .._mma import key_channel_order

        device = self.query_map.device
        rotation = _block_diag([g.rotation.to(device, torch.float32) for g in self.key_groups])
        return rotation.T[:, key_channel_order(self.head_dim, device, self.mma_split)].contiguous()

    @cached_property
    def mma_value_rows(self) -> torch.Tensor:
        """int32 (head_dim,): the rotated value channel of each output row of the register-operand kernel."""
        from .._mma import value_channel_order

        return value_channel_order(self.head_dim, self.query_map.device, self.mma_split).to(torch.int32)

    @property
    def mma_bits(self) -> tuple[int, int]:
        """The key and value code widths the register-operand kernel compiles for (``_mma.SPLIT_BITS`` for split
        streams)."""
        from .._mma import SPLIT_BITS

        return (SPLIT_BITS, SPLIT_BITS) if self.mma_split else (self.key_groups[0].bits, self.value_groups[0].bits)

    @cached_property
    def mma_tables(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The key and value codebooks' byte tables (``_decode.prmt_byte_tables``, each stream's groups in order),
        read back once."""
        return (sum(map(prmt_byte_tables, self.key_tables), ()), sum(map(prmt_byte_tables, self.value_tables), ()))

    @cached_property
    def mma_pair_table(self) -> torch.Tensor | None:
        """The shared codebook's pair table (``_decode.pair_lut_table``, int32 (256,)) that the register-operand
        kernel's ``"lut"`` decoder reads, or None unless both streams are one 4-bit group of the same codebook."""
        tables = (*self.key_tables, *self.value_tables)
        if len(tables) != 2 or any(g.bits != 4 for g in (*self.key_groups, *self.value_groups)):
            return None
        key, value = (host_codebook(t) for t in tables)
        return pair_lut_table(tables[0]) if torch.equal(key, value) else None

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
                key_geometry = _key_geometry(key_groups[part], query_offset)
                blocks.append(_key_stage_columns(key_groups[part], key_geometry, device))
                query_offset += blocks[-1].shape[1]
            else:
                key_geometry = _ABSENT_KEY_GROUP
            value_geometry = (_value_geometry(value_groups[part], sum(value_dims[:part]))
                              if part < len(value_groups) else _ABSENT_VALUE_GROUP)
            meta[f"K{part}"], meta[f"V{part}"] = tuple(key_geometry), tuple(value_geometry)

        def table(group: ChannelGroup) -> torch.Tensor:
            centroids = group.centroids if group.bits else torch.zeros(1)  # QJL alone: no table is read
            return centroids.to(device=device, dtype=torch.float16).contiguous()

        value_rotation = _block_diag([g.rotation.to(device, torch.float32) for g in value_groups]).contiguous()
        return cls(key_groups, value_groups, _block_diag(blocks), tuple(map(table, key_groups)),
                   tuple(map(table, value_groups)), value_rotation, meta)


def _block_diag(blocks: list[torch.Tensor]) -> torch.Tensor:
    """``torch.block_diag``, without a copy for one block (``decode_attention_triton`` builds a format per call)."""
    return blocks[0] if len(blocks) == 1 else torch.block_diag(*blocks)


class KeyGeometry(NamedTuple):
    """Compile-time geometry of one key channel group, in the order the kernel unpacks it: MSE code width and
    layout (``_layout``; ``bpg``, ``cpg`` = 1 at 0 bits), code groups padded to a power of two, whether a QJL
    stage follows, its sign groups (1-bit codes), and where the group's stage queries start in the query row."""

    bits: int
    bpg: int
    cpg: int
    groups: int
    qjl: bool
    sign_groups: int
    q_off: int
    qjl_q_off: int


class ValueGeometry(NamedTuple):
    """Compile-time geometry of one value channel group, in the kernel's order: code width and layout, code
    groups padded to a power of two, channels, and the first channel of its rotated output."""

    bits: int
    bpg: int
    cpg: int
    groups: int
    dim: int
    off: int


def _key_geometry(group: ChannelGroup, query_offset: int) -> KeyGeometry:
    bpg, cpg = group_geometry(group.bits) if group.bits else (1, 1)
    groups = pow2_at_least(num_groups(group.dim, group.bits), floor=1) if group.bits else 1
    return KeyGeometry(group.bits, bpg, cpg, groups, group.sketch is not None,
                       pow2_at_least(num_groups(group.dim, 1), floor=1), query_offset,
                       query_offset + (cpg * groups if group.bits else 0))


def _key_stage_columns(group: ChannelGroup, geometry: KeyGeometry, device: torch.device) -> torch.Tensor:
    """(dim, L_g) float32: the group's stage queries in stream order are ``q_g @ this`` (``Pi_g``, ``gamma_g S_g``)."""
    columns = []
    if group.bits:
        columns.append(_stream_columns(group.rotation.to(device), geometry.cpg, geometry.groups))
    if group.sketch is not None:
        columns.append(_stream_columns(group.qjl_scale * group.sketch.to(device, torch.float32), 8,
                                       geometry.sign_groups))
    return columns[0] if len(columns) == 1 else torch.cat(columns, dim=1)


def _value_geometry(group: ChannelGroup, channel_offset: int) -> ValueGeometry:
    bpg, cpg = group_geometry(group.bits)
    return ValueGeometry(group.bits, bpg, cpg, pow2_at_least(num_groups(group.dim, group.bits)), group.dim,
                         channel_offset)


# an absent second channel group (never read: K_SPLIT / V_SPLIT are False)
_ABSENT_KEY_GROUP = KeyGeometry(bits=0, bpg=1, cpg=1, groups=1, qjl=False, sign_groups=1, q_off=0, qjl_q_off=0)
_ABSENT_VALUE_GROUP = ValueGeometry(bits=1, bpg=1, cpg=8, groups=16, dim=0, off=0)


def _check_stream(name: str, fields: Sequence[QuantizedVectors], groups: Sequence[ChannelGroup], batch: int) -> None:
    if len(fields) != len(groups):
        raise ValueError(f"{name}: {len(fields)} channel groups of codes for a format of {len(groups)}")
    for part, (field, group) in enumerate(zip(fields, groups)):
        label = f"{name} group {part}"
        if not isinstance(field, QuantizedVectors):
            raise ValueError(f"{label}: expected QuantizedVectors, got {type(field).__name__}")
        if (field.dim, field.mse_bits) != (group.dim, group.bits):
            raise ValueError(f"{label}: codes of dim {field.dim} with {field.mse_bits}-bit MSE codes for a group of "
                             f"dim {group.dim} with {group.bits}")
        if field.codes.ndim != 4 or field.codes.dtype != torch.uint8:
            raise ValueError(f"{label}: codes must be uint8 (batch, kv_heads, tokens, row_bytes), got "
                             f"{field.codes.dtype} {tuple(field.codes.shape)}")
        row_bytes = packed_size(group.dim, group.bits) if group.bits else 0  # bits 0: a QJL-only key group
        if field.codes.shape[-1] != row_bytes:
            raise ValueError(f"{label}: code rows must hold {row_bytes} bytes "
                             f"(dim={group.dim}, bits={group.bits}), got {field.codes.shape[-1]}")
        lead = tuple(field.codes.shape[:3])
        if tuple(field.norms.shape) != lead:
            raise ValueError(f"{label}: norms must be {lead}, got {tuple(field.norms.shape)}")
        if (field.qjl_signs is None) != (group.sketch is None) or \
                (field.residual_norms is None) != (group.sketch is None):
            raise ValueError(f"{label}: QJL signs and residual norms are given exactly when the group has a sketch")
        if field.qjl_signs is not None:
            signs_shape = (*lead, packed_size(group.dim, 1))
            if field.qjl_signs.dtype != torch.uint8 or tuple(field.qjl_signs.shape) != signs_shape:
                raise ValueError(f"{label}: qjl_signs must be uint8 {signs_shape}, got "
                                 f"{field.qjl_signs.dtype} {tuple(field.qjl_signs.shape)}")
            if tuple(field.residual_norms.shape) != lead:
                raise ValueError(f"{label}: residual_norms must be {lead}, got {tuple(field.residual_norms.shape)}")
        if lead[0] != batch:
            raise ValueError(f"{label}: batch {lead[0]} != q batch {batch}")


def check_inputs(q: torch.Tensor, keys: Sequence[QuantizedVectors], values: Sequence[QuantizedVectors],
                 seq_lens: torch.Tensor, cache_format: CacheFormat, key_permutation: torch.Tensor | None,
                 value_permutation: torch.Tensor | None) -> None:
    """ValueError naming the first argument of a decode call that does not fit ``cache_format`` or the others."""
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


def one_group_cache(q: torch.Tensor, k_codes: torch.Tensor, k_norms: torch.Tensor, v_codes: torch.Tensor,
                    v_norms: torch.Tensor, k_centroids: torch.Tensor, v_centroids: torch.Tensor, k_bits: int,
                    v_bits: int, rotation: torch.Tensor, v_rotation: torch.Tensor | None,
                    ) -> tuple[list[QuantizedVectors], list[QuantizedVectors], CacheFormat]:
    """The codes and format of a cache with one TurboQuant_mse channel group per stream."""
    if q.ndim != 3:
        raise ValueError(f"q must be (batch, query_heads, head_dim), got {tuple(q.shape)}")
    dim = q.shape[-1]
    v_rotation = rotation if v_rotation is None else v_rotation
    cache_format = CacheFormat.build([ChannelGroup(dim, k_bits, rotation, k_centroids)],
                                     [ChannelGroup(dim, v_bits, v_rotation, v_centroids)], q.device)
    (key_group,), (value_group,) = cache_format.key_groups, cache_format.value_groups
    return [key_group.packed(k_codes, k_norms)], [value_group.packed(v_codes, v_norms)], cache_format
