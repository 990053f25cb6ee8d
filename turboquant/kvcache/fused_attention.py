"""Decode attention that reads a TurboQuant KV cache's packed codes directly (the issue-5 "fast path").

``TurboQuantLayer`` on its own materialises decoded keys and values (a 16-bit *workspace*) so that the
model's stock attention can read them. Here, for decode steps (one new query token), attention reads the
packed store instead, through the Triton flash-decoding kernel
(:func:`turboquant.kernels.decode_attention_groups_triton`), and the decoded workspace is never built.

A decode step of a quantized layer attends over three parts of the sequence:

1. the packed store (tokens ``0 .. n_q - 1``): the kernel returns ``o_p`` and ``lse_p = log sum_t exp(s_t)``
   with ``s_t = scale * <q, k~_t>``, reading codes and norms only (values are accumulated in the rotated
   domain and rotated back once, see the kernel's docstring);
2. the 16-bit tokens of the cache: its residual window (``residual_length``) and sink tokens (``sink_tokens``), and
3. the new token itself, which attends to itself at full precision (as in every cache of this package).

Parts 2 and 3 are a handful of tokens: plain torch attention gives ``o_e`` and ``lse_e``. The two partial
results are merged exactly by their log-sum-exp,

    o = (e^{lse_p - m} o_p + e^{lse_e - m} o_e) / (e^{lse_p - m} + e^{lse_e - m}),   m = max(lse_p, lse_e),

which is softmax attention over the concatenation (flash-decoding's combine step).

Key centering (``center_keys``). The store holds ``k~ - mu`` with ``mu`` the per-(row, KV head) prefill mean,
and attention must see ``k~`` (the new token's key is exact): ``<q, k~ + mu> = <q, k~> + <q, mu>``. The shift
``scale * <q, mu>`` is common to every packed token of a (row, query head), so ``o_p`` is unchanged and only
``lse_p`` moves by it before the merge. Exact.

Configurations. The kernel reads every TurboQuant layout of this package: TurboQuant_mse or TurboQuant_prod keys
(the QJL sign bits of the residual are one more stage of the logit, a 1-bit code against ``gamma S q``), with or
without the outlier channel split of the fractional-bit presets (2.5 / 3.5 bits: two channel groups per vector,
each with its own rotation, codebook, bit width and norm, in a per-(row, KV head) channel order, which the kernel
applies to the query and undoes on the output; see :mod:`turboquant.kernels.decode_attention` for the math).
What remains, named by :func:`turboquant.backends.decode_read_path` and served by the workspace path instead: MSE
codes wider than 4 bits (the kernels implement 1-4; TurboQuant_prod keys store ``bits - 1``-bit MSE codes, so prod
runs up to 5), streams that are not TurboQuant codes, and devices where the Triton kernels do not run.

At run time a decode step also takes the torch path (decode the packed store, then the model's attention) when
the attention mask hides some cached token (left-padded batches: the kernel has no per-token mask) and for a
multi-token forward over a non-empty cache (chunked prefill); the prefill itself uses the model's attention.
Without Triton on the device (CPU without ``TRITON_INTERPRET=1``), a fused layer keeps the workspace and behaves
exactly as the workspace path.

This module holds the math of the read path (pure functions over the layer's encoders and fields); the layer is
:class:`~turboquant.kvcache.turboquant_cache.TurboQuantLayer` built with ``fused_decode=True`` (or ``"auto"``:
fused where ``TurboQuantCacheConfig.read_path`` finds no reason against it), and its decode steps reach it through
the attention function of :func:`turboquant.kvcache.attach`::

    cache = build_cache("turboquant", model.config, key_bits=4, value_bits=4, fused_decode=True)
    with attach(model, cache):
        out = model.generate(**inputs, past_key_values=cache, max_new_tokens=32, do_sample=False)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

import turboquant as tq
from turboquant.kvcache.stream import Fields

if TYPE_CHECKING:  # the kernel module imports Triton: at run time only where a kernel runs
    from turboquant.kernels.decode_attention import CacheFormat, ChannelGroup
    from turboquant.kvcache.turboquant_cache import TurboQuantEncoder

__all__ = ["DecodeStep", "cache_format", "decode_step_attention", "hides_tokens"]


@dataclass
class DecodeStep:
    """What one decode step of one layer attends over, captured before the new token was written."""

    key_fields: Fields | None      # packed store (None when empty): its stored tokens, or a static store's storage
    value_fields: Fields | None
    quantized: int                 # stored tokens, counted on the host
    seq_lens: torch.Tensor | None  # (B,) int32 stored tokens per row, on the device: what the kernel reads
    exact_keys: torch.Tensor       # (B, kv_heads, s + r + 1, d): sink tokens, residual window, new token
    exact_values: torch.Tensor
    sink_tokens: int = 0           # s: the first s exact tokens are the sequence's first (``sink_tokens``)


def decode_step_attention(query: torch.Tensor, step: DecodeStep, key_encoder: TurboQuantEncoder,
                          value_encoder: TurboQuantEncoder, format_: CacheFormat | None, scale: float) -> torch.Tensor:
    """Attention output (B, query_heads, d) float32 of the one-token ``query`` (B, query_heads, 1, d): the
    kernel over the packed store and torch over the exact tokens, merged by their log-sum-exp (module doc)."""
    q = query[:, :, 0].float()
    out_e, lse_e = _torch_attention(q, step.exact_keys, step.exact_values, scale)
    if step.quantized == 0:
        return out_e
    out_p, lse_p = packed_attention(q, step, key_encoder, value_encoder, format_, scale)
    top = torch.maximum(lse_p, lse_e)
    w_p, w_e = torch.exp(lse_p - top), torch.exp(lse_e - top)
    return (w_p[..., None] * out_p + w_e[..., None] * out_e) / (w_p + w_e)[..., None]


def packed_attention(q: torch.Tensor, step: DecodeStep, key_encoder: TurboQuantEncoder,
                     value_encoder: TurboQuantEncoder, format_: CacheFormat, scale: float
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Output (B, H, d) and log-sum-exp (B, H) of ``q`` (B, H, d) over the packed store, in the kernel."""
    from turboquant.kernels import decode_attention_groups_triton

    out, lse = decode_attention_groups_triton(
        q, key_encoder.group_vectors(step.key_fields), value_encoder.group_vectors(step.value_fields), step.seq_lens,
        format_, key_permutation=key_encoder.permutation, value_permutation=value_encoder.permutation, scale=scale,
        return_lse=True,
    )
    if key_encoder.key_mean is not None:  # <q, k~ + mu> = <q, k~> + <q, mu>: shifts lse only
        group = q.shape[1] // key_encoder.key_mean.shape[1]
        mean = key_encoder.key_mean.float().repeat_interleave(group, dim=1)
        lse = lse + scale * (q * mean).sum(-1)
    return out, lse


def cache_format(key_encoder: TurboQuantEncoder, value_encoder: TurboQuantEncoder,
                 device: torch.device) -> CacheFormat:
    """The kernel's constants for a layer's quantizers (rotations, codebooks, QJL matrices and the query map
    derived from them)."""
    from turboquant.kernels.decode_attention import CacheFormat

    return CacheFormat.build([_channel_group(quantizer) for quantizer in key_encoder.quantizers],
                             [_channel_group(quantizer) for quantizer in value_encoder.quantizers], device)


def _channel_group(quantizer: tq.TurboQuantMSE | tq.TurboQuantProd) -> ChannelGroup:
    """The kernel's description of one channel group, read off the quantizer's score stages
    (:meth:`~turboquant.quantizers.TurboQuantMSE.score_stages`): the MSE stage's codebook and transform Pi, the
    QJL stage's transform S and scale. A stage's transform maps query rows y to y T^T, so T = transform(I)^T."""
    from turboquant.kernels.decode_attention import ChannelGroup

    stages = {stage.codes: stage for stage in quantizer.score_stages()}
    mse, qjl = stages.get("codes"), stages.get("qjl_signs")  # no MSE stage: TurboQuant_prod at 1 bit (QJL alone)
    if set(stages) - {"codes", "qjl_signs"} or (qjl is not None and qjl.row_weight != "residual_norms"):
        raise ValueError(f"the decode kernel reads an MSE stage and TurboQuant_prod's QJL stage of the residual, "
                         f"not stages {sorted(stages)}")
    eye = torch.eye(quantizer.dim, device=quantizer.device)
    return ChannelGroup(
        dim=quantizer.dim, bits=0 if mse is None else mse.bits,
        rotation=None if mse is None else mse.query_transform(eye).T,
        centroids=None if mse is None else mse.centroids,
        sketch=None if qjl is None else qjl.query_transform(eye).T,
        qjl_scale=None if qjl is None else qjl.scale,
    )


def _torch_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                     scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Output (B, H, d) and natural log-sum-exp (B, H) of one query per head over a few exact tokens (GQA)."""
    batch, heads, dim = q.shape
    kv_heads = keys.shape[1]
    grouped = q.view(batch, kv_heads, heads // kv_heads, dim)
    logits = scale * torch.einsum("bkgd,bktd->bkgt", grouped, keys.float())
    top = logits.amax(dim=-1, keepdim=True)  # finite: every query sees at least its own token
    weights = torch.exp(logits - top)
    total = weights.sum(dim=-1, keepdim=True)
    lse = (top + torch.log(total)).squeeze(-1)
    out = torch.einsum("bkgt,bktd->bkgd", weights / total, values.float())
    return out.reshape(batch, heads, dim), lse.reshape(batch, heads)


def hides_tokens(attention_mask: torch.Tensor | None) -> bool:
    """True when the mask excludes some key position (bool: False entries; additive float: negative entries)."""
    if attention_mask is None:
        return False
    if attention_mask.dtype == torch.bool:
        return not bool(attention_mask.all())
    return bool((attention_mask < 0).any())
