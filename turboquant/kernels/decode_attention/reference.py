"""Float64 reference of the decode kernel: attention over the dequantized cache (what the tests compare with)."""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ...codes import QuantizedVectors
from .format import CacheFormat, ChannelGroup, check_inputs, one_group_cache


def dequantize_group_reference(field: QuantizedVectors, group: ChannelGroup) -> torch.Tensor:
    """Float64 ``n (Pi^T c[idx] + gamma rho S^T z)`` (the QJL term for a group with a sketch): (..., dim)."""
    from turboquant.packing import unpack_codes

    unit = torch.zeros(*field.norms.shape, group.dim, dtype=torch.float64, device=field.norms.device)
    if group.bits:
        rotated = group.centroids.to(torch.float64)[unpack_codes(field.codes, group.bits, group.dim).long()]
        unit = unit + rotated @ group.rotation.to(torch.float64)
    if group.sketch is not None:
        signs = unpack_codes(field.qjl_signs, 1, group.dim).to(torch.float64) * 2 - 1
        unit = unit + group.qjl_scale * field.residual_norms.to(torch.float64)[..., None] * (
            signs @ group.sketch.to(torch.float64))
    return field.norms.to(torch.float64)[..., None] * unit


def dequantize_stream_reference(fields: Sequence[QuantizedVectors], groups: Sequence[ChannelGroup],
                                permutation: torch.Tensor | None = None) -> torch.Tensor:
    """Float64 vectors (batch, kv_heads, tokens, head_dim) in the model's channel order: the groups concatenated
    (``x_P``), then ``x[perm[j]] = x_P[j]``."""
    permuted = torch.cat([dequantize_group_reference(f, g) for f, g in zip(fields, groups)], dim=-1)
    if permutation is None:
        return permuted
    index = permutation.to(device=permuted.device, dtype=torch.int64)[:, :, None].expand_as(permuted)
    return torch.empty_like(permuted).scatter_(-1, index, permuted)


def decode_attention_groups_reference(
    q: torch.Tensor, keys: Sequence[QuantizedVectors], values: Sequence[QuantizedVectors], seq_lens: torch.Tensor,
    cache_format: CacheFormat, *, key_permutation: torch.Tensor | None = None,
    value_permutation: torch.Tensor | None = None, scale: float | None = None, return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Float64 attention over the dequantized cache (rows masked past ``seq_lens``): (batch, heads, dim), and the
    log-sum-exp of the scaled logits with ``return_lse``. Reads only the format's groups, not its derived maps."""
    check_inputs(q, keys, values, seq_lens, cache_format, key_permutation, value_permutation)
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
    keys, values, cache_format = one_group_cache(q, k_codes, k_norms, v_codes, v_norms, k_centroids, v_centroids,
                                            k_bits, v_bits, rotation, v_rotation)
    return decode_attention_groups_reference(q, keys, values, seq_lens, cache_format, scale=scale)
