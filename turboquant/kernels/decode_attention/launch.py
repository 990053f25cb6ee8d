"""Host entry points of the decode kernel: argument checks, tile and split defaults, the query's stage map,
and the launches (split, then merge and rotate)."""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import triton

from ...backends import decode_kernel
from .._decode import resolve_decoder
from .._layout import check_device, pow2_at_least
from ...codes import QuantizedVectors
from .format import MAX_CHANNEL_GROUPS, CacheFormat, check_inputs, one_group_cache
from .kernel import decode_split_kernel, merge_kernel, rotate_kernel

_COMBINE_TILE = 8192  # elements of the merge / rotate kernels' 3-D tiles: 64 fp32 registers per thread at 4 warps
_MERGE_SLICE = 32  # rotated channels per merge program (benchmarks/NOTES.md, session 16: too few programs)


def default_block_n(cache_format: CacheFormat, decoder: str) -> int:
    """Tokens per tile: 128 with the ``"prmt"`` decoder (without per-code gathers the loop is no longer bound by
    the L1 pipe, so longer tiles amortise the per-tile softmax) or when a stream is split into two channel groups
    (the split-kernel sweep), else 64 (``benchmarks/NOTES.md``, Sessions 3 and 5)."""
    return 128 if decoder == "prmt" or cache_format.meta["K_SPLIT"] or cache_format.meta["V_SPLIT"] else 64


def default_num_splits(batch: int, n_kv_heads: int, max_tokens: int, device: torch.device,
                       block_n: int) -> int:
    """Splits so that about eight programs per SM run (flash-decoding; eight rather than four: ``benchmarks/NOTES.md``),
    at least one tile per split."""
    n_sm = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
    wanted = triton.cdiv(8 * n_sm, batch * n_kv_heads)
    return max(1, min(wanted, triton.cdiv(max_tokens, block_n)))


@dataclass(frozen=True)
class SplitPlan:
    """What one decode-attention launch runs: the split kernel (``"mma"`` or ``"tiles"``), its decoder (the tile
    kernel's: ``_decode.resolve_decoder``; the register-operand kernel's: :func:`.mma.resolve_mma_decoder`), tokens per
    tile, and the KV splits with the tokens each
    covers (a multiple of ``block_n``; ``num_splits = ceil(max_tokens / tokens_per_split)``)."""

    kernel: str
    decoder: str
    block_n: int
    num_splits: int
    tokens_per_split: int


def split_plan(cache_format: CacheFormat, batch: int, n_heads: int, n_kv_heads: int, max_tokens: int,
               device: torch.device, *, kernel: str = "auto", decoder: str = "auto", inner: str = "dot",
               lookup: bool = True, block_n: int | None = None, num_splits: int | None = None,
               num_stages: int = 2) -> SplitPlan:
    """The :class:`SplitPlan` of :func:`decode_attention_groups_triton` for these options (its docstring; None /
    ``"auto"`` take the defaults): ``kernel="auto"`` is ``"mma"`` where it serves the cache
    (:meth:`CacheFormat.mma_unsupported`, ``turboquant.backends.decode_kernel``) unless the tile kernel's own
    options (``decoder`` other than the ``"lut"`` ones, ``inner``, ``lookup``) were asked for; ``decoder="lut"``,
    ``"lut-keys"`` and ``"lut-values"`` are the register-operand kernel's alone."""
    if kernel == "auto" and decoder.startswith("lut"):
        kernel = "mma"
    if kernel == "auto" and (decoder != "auto" or inner != "dot" or not lookup):
        kernel = "tiles"
    kernel = decode_kernel(kernel, device, cache_format.mma_unsupported(n_heads, n_kv_heads)).chosen
    if kernel == "mma":
        from .mma import default_mma_splits, resolve_mma_decoder

        block_n = block_n or 32

        def splits(mma_decoder: str) -> int:
            return num_splits or default_mma_splits(batch, n_kv_heads, max_tokens, device, block_n,
                                                    n_heads // n_kv_heads, num_stages, cache_format.mma_bits,
                                                    mma_decoder)

        tiles = triton.cdiv(max_tokens, splits("prmt") * block_n) if decoder == "auto" else 0
        decoder = resolve_mma_decoder(decoder, cache_format, tiles)
        num_splits = splits(decoder)
    else:
        decoder = resolve_decoder(decoder, device, lambda: cache_format.symmetric)
        block_n = block_n or default_block_n(cache_format, decoder)
        num_splits = num_splits or default_num_splits(batch, n_kv_heads, max_tokens, device, block_n)
    tokens_per_split = triton.cdiv(triton.cdiv(max_tokens, num_splits), block_n) * block_n
    num_splits = triton.cdiv(max_tokens, tokens_per_split) if max_tokens else 1
    return SplitPlan(kernel, decoder, block_n, num_splits, tokens_per_split)


def _row_contiguous(t: torch.Tensor | None) -> torch.Tensor | None:
    return t if t is None or t.stride(-1) == 1 else t.contiguous()


def _key_group_args(field: QuantizedVectors | None, table: torch.Tensor | None,
                    stand_in: QuantizedVectors) -> tuple:
    """Kernel argument ``k{g}`` of one key group: ``(codes, norms, qjl_signs, residual_norms, table, code_bytes,
    sign_bytes)``, each tensor field as ``(tensor, stride_b, stride_h[, stride_t])``; an absent group or stage
    passes ``stand_in`` (never read)."""
    field = stand_in if field is None else field
    codes, norms = _row_contiguous(field.codes), _row_contiguous(field.norms)
    signs = _row_contiguous(field.qjl_signs) if field.qjl_signs is not None else codes
    rnorms = _row_contiguous(field.residual_norms) if field.residual_norms is not None else norms
    if codes.shape[-1] == 0:  # QJL alone: no MSE codes (an empty tensor may have no storage to point at)
        codes = signs
    return ((codes, *codes.stride()[:3]), (norms, *norms.stride()[:2]), (signs, *signs.stride()[:3]),
            (rnorms, *rnorms.stride()[:2]), stand_in.norms if table is None else table, codes.shape[-1],
            signs.shape[-1])


def _value_group_args(field: QuantizedVectors | None, table: torch.Tensor | None,
                      stand_in: QuantizedVectors) -> tuple:
    """Kernel argument ``v{g}`` of one value group: ``(codes, norms, table, code_bytes)``, tensor fields as in
    :func:`_key_group_args` (``stand_in`` for an absent group, never read)."""
    field = stand_in if field is None else field
    codes, norms = _row_contiguous(field.codes), _row_contiguous(field.norms)
    return ((codes, *codes.stride()[:3]), (norms, *norms.stride()[:2]), stand_in.norms if table is None else table,
            codes.shape[-1])


def decode_attention_groups_triton(
    q: torch.Tensor,
    keys: Sequence[QuantizedVectors],
    values: Sequence[QuantizedVectors],
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
    decoder: str = "auto",
    inner: str = "dot",
    kernel: str = "auto",
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention of one new query token per sequence over a packed cache of channel groups (module docstring).

    Args:
        q: (batch, query_heads, head_dim) queries in the model's channel order (any float dtype; the output
            has it too).
        keys, values: the codes of each channel group (outliers first), as ``cache_format`` describes them:
            :class:`~turboquant.QuantizedVectors` of leading shape (batch, kv_heads, tokens), norms float16 or
            float32, whose token axis may be strided (a slice of a larger cache).
        seq_lens: (batch,) number of valid cached tokens per row (<= tokens).
        cache_format: the groups' rotations, codebooks and QJL matrices (:meth:`CacheFormat.build`, once).
        key_permutation, value_permutation: (batch, kv_heads, head_dim) channel order of each stream
            (``x_P = x[perm]``, groups are consecutive in it); None: the identity.
        scale: softmax scale, default 1 / sqrt(head_dim).
        num_splits: KV splits per (row, KV head); default fills the GPU (``default_num_splits``).
        block_n, num_warps, num_stages: tokens per tile, warps per program, pipeline depth (tuning). block_n
            defaults to :func:`default_block_n`.
        lookup: False skips the centroid lookups and returns wrong values (benchmark attribution only).
        decoder: how codes become centroids in registers (``turboquant.kernels._decode``): ``"table"`` (gather
            from the codebook in memory), ``"select"`` (register codebook, needs the symmetric Lloyd-Max
            codebook), ``"prmt"`` (byte-permute lookups for 3- and 4-bit groups in inline PTX: GPU only), or
            ``"auto"`` (``"prmt"`` on CUDA for symmetric codebooks, else ``"table"``: ``_decode.resolve_decoder``).
            The register-operand kernel takes ``"prmt"``, ``"lut"`` (two codes per load from a pair table in shared
            memory, a copy per two lanes: 4-bit keys and values of one codebook), ``"lut-keys"`` / ``"lut-values"``
            (the table for that stream, byte permutes for the other) or ``"auto"`` (``"lut-keys"`` where
            the table serves the cache and each split covers enough tiles to repay its fill, else ``"prmt"``;
            :func:`.mma.resolve_mma_decoder`).
        inner: the multiply of the inner loop: ``"dot"`` (tensor cores, the GQA group padded to 16 rows) or
            ``"fma"`` (CUDA-core FMAs over the group's own rows; decode is a matrix-vector product per head).
        kernel: the split kernel: ``"tiles"`` (:mod:`.kernel`, every layout; ``decoder`` / ``inner`` / ``lookup``
            choose its inner loop), ``"mma"`` (:mod:`.mma`, Gluon, GPU only: decoded codes as register operands
            of ``mma.sync``, for the layouts :meth:`CacheFormat.mma_unsupported` accepts; one-warp programs, ``block_n``
            default 32, ``num_stages`` its loads' pipeline (:func:`.mma.mma_split_kernel`'s ``STAGES``: 1 none, 2
            the next tile in registers), ``num_splits`` default one wave of resident programs:
            :func:`.mma.default_mma_splits`) or ``"auto"``: ``"mma"`` where it serves, else ``"tiles"``
            (``turboquant.backends.decode_kernel``); ``"tiles"`` as well when ``decoder``, ``inner`` or ``lookup`` is
            not its default.
        return_lse: also return ``log sum_t exp(scale * <q, k~_t>)`` per (row, query head), float32
            (batch, query_heads), ``-inf`` for a row without tokens: what an exact merge with attention over
            other tokens needs (``o = sum_i exp(lse_i - lse) o_i``, ``lse = log sum_i exp(lse_i)``).
    """
    check_inputs(q, keys, values, seq_lens, cache_format, key_permutation, value_permutation)
    check_device(q.device)
    if inner not in ("dot", "fma"):
        raise ValueError(f"inner must be 'dot' or 'fma', got {inner!r}")
    batch, n_heads, dim = q.shape
    n_kv_heads, max_tokens = keys[0].codes.shape[1], keys[0].codes.shape[2]
    group = n_heads // n_kv_heads
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    plan = split_plan(cache_format, batch, n_heads, n_kv_heads, max_tokens, q.device, kernel=kernel, decoder=decoder,
                      inner=inner, lookup=lookup, block_n=block_n, num_splits=num_splits, num_stages=num_stages)
    # q_P (the GQA group of query heads shares its KV head's channel order) times the kernel's query map, fp16
    query_map = cache_format.mma_query_map if plan.kernel == "mma" else cache_format.query_map
    q_mapped = torch.empty((batch, n_heads, query_map.shape[1]), dtype=torch.float16, device=q.device)
    _rotate(q, query_map, q_mapped, group, key_permutation, "input")
    tokens_per_split, num_splits = plan.tokens_per_split, plan.num_splits
    part_out = torch.empty((batch, n_heads, num_splits, dim), dtype=torch.float32, device=q.device)
    part_lse = torch.empty((batch, n_heads, num_splits), dtype=torch.float32, device=q.device)
    if plan.kernel == "mma":  # Gluon, imported only here: Triton releases before Gluon still run the tile kernel
        from .mma import mma_split

        mma_split(q_mapped, keys, values, seq_lens, cache_format, part_out, part_lse, tokens_per_split,
                  plan.block_n, scale * math.log2(math.e), num_stages, plan.decoder)
    else:
        _tiles_split(q_mapped, keys, values, seq_lens, cache_format, part_out, part_lse, tokens_per_split, scale,
                     group, plan.block_n, plan.decoder if lookup else "none", inner, num_warps, num_stages)
    return _combine(part_out, part_lse, cache_format, value_permutation, q.dtype, group, return_lse)


def _rotate(x: torch.Tensor, mat: torch.Tensor, out: torch.Tensor, group: int, permutation: torch.Tensor | None,
            permute: str) -> None:
    """Launch :func:`.kernel.rotate_kernel`: ``out[b, h] = x[b, h] @ mat`` per GQA group of ``group`` heads, x's
    columns gathered through ``permutation`` (batch, kv_heads, dim) when ``permute="input"``, out's scattered through
    it when ``"output"``; no permutation when it is None."""
    x = _row_contiguous(x)
    batch, n_heads, dim = x.shape
    cols = mat.shape[1]
    if permutation is None:
        permute, permutation = "none", out  # the stand-in is never read
    else:
        permutation = permutation.to(out.device)
    rows, block_d = pow2_at_least(group, floor=1), pow2_at_least(dim)
    block_j = min(max(1, _COMBINE_TILE // (rows * block_d)), pow2_at_least(cols))
    rotate_kernel[(batch, n_heads // group, triton.cdiv(cols, block_j))](
        x, mat, permutation, out, dim, cols, x.stride(0), x.stride(1), mat.stride(0), mat.stride(1), out.stride(0),
        out.stride(1), permutation.stride(0), permutation.stride(1),
        GROUP=group, BLOCK_M=rows, BLOCK_D=block_d, BLOCK_J=block_j, PERMUTE=permute, num_warps=4,
    )


def _tiles_split(q_stages: torch.Tensor, keys: Sequence[QuantizedVectors], values: Sequence[QuantizedVectors],
                 seq_lens: torch.Tensor, cache_format: CacheFormat, part_out: torch.Tensor, part_lse: torch.Tensor,
                 tokens_per_split: int, scale: float, group: int, block_n: int, decode: str, inner: str,
                 num_warps: int, num_stages: int) -> None:
    """Launch :func:`.kernel.decode_split_kernel` over ``part_out`` / ``part_lse``; ``q_stages``: the query times
    :attr:`CacheFormat.query_map`, fp16."""
    batch, n_kv_heads, num_splits = q_stages.shape[0], keys[0].codes.shape[1], part_out.shape[2]
    stand_in = keys[0]
    k_args = [_key_group_args(keys[g] if g < len(keys) else None,
                              cache_format.key_tables[g] if g < len(keys) else None, stand_in)
              for g in range(MAX_CHANNEL_GROUPS)]
    v_args = [_value_group_args(values[g] if g < len(values) else None,
                                cache_format.value_tables[g] if g < len(values) else None, values[0])
              for g in range(MAX_CHANNEL_GROUPS)]
    decode_split_kernel[(batch, n_kv_heads, num_splits)](
        q_stages, seq_lens, part_out, part_lse, *k_args, *v_args,
        tokens_per_split, q_stages.stride()[:2], part_out.stride()[:3], part_lse.stride()[:2],
        scale * math.log2(math.e),
        GROUP=group, BLOCK_M=pow2_at_least(group, floor=16 if inner == "dot" else 1), BLOCK_N=block_n,
        DECODE=decode, INNER=inner, **cache_format.meta,
        num_warps=num_warps, num_stages=num_stages,
    )


def _combine(part_out: torch.Tensor, part_lse: torch.Tensor, cache_format: CacheFormat,
             value_permutation: torch.Tensor | None, dtype: torch.dtype, group: int,
             return_lse: bool) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Launch :func:`.kernel.merge_kernel` and :func:`.kernel.rotate_kernel`: the splits merged, rotated back and
    un-permuted."""
    batch, n_heads, num_splits, dim = part_out.shape
    device = part_out.device
    o_rot = torch.empty((batch, n_heads, dim), dtype=torch.float32, device=device)
    out = torch.empty((batch, n_heads, dim), dtype=dtype, device=device)
    lse = torch.empty((batch, n_heads), dtype=torch.float32, device=device) if return_lse else part_lse
    rows, block_d = pow2_at_least(group, floor=1), pow2_at_least(dim)
    slice_ = min(_MERGE_SLICE, block_d)
    merge_kernel[(batch, n_heads // group, triton.cdiv(dim, slice_))](
        part_out, part_lse, o_rot, lse, num_splits, dim,
        part_out.stride(0), part_out.stride(1), part_out.stride(2), part_lse.stride(0), part_lse.stride(1),
        o_rot.stride(0), o_rot.stride(1), lse.stride(0),
        GROUP=group, BLOCK_M=rows, BLOCK_S=min(max(1, _COMBINE_TILE // (rows * slice_)), pow2_at_least(num_splits, 1)),
        SLICE=slice_, WRITE_LSE=return_lse, num_warps=4,
    )
    _rotate(o_rot, cache_format.value_rotation, out, group, value_permutation, "output")
    return (out, lse) if return_lse else out


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
        options: ``scale``, ``num_splits``, ``block_n``, ``num_warps``, ``num_stages``, ``lookup``, ``decoder``,
            ``inner``, ``return_lse`` of :func:`decode_attention_groups_triton`.
    """
    keys, values, cache_format = one_group_cache(q, k_codes, k_norms, v_codes, v_norms, k_centroids, v_centroids,
                                            k_bits, v_bits, rotation, v_rotation)
    return decode_attention_groups_triton(q, keys, values, seq_lens, cache_format, **options)
