"""Decode attention that reads a TurboQuant KV cache's packed codes directly (the issue-5 "fast path").

``TurboQuantLayer`` on its own materialises decoded keys and values (a 16-bit *workspace*) so that the
model's stock attention can read them. Here, for decode steps (one new query token), attention reads the
packed store instead, through the Triton flash-decoding kernel
(:func:`turboquant.kernels.decode_attention_groups_triton`), and the decoded workspace is never built.

A decode step of a quantized layer attends over three parts of the sequence:

1. the packed store (tokens ``0 .. n_q - 1``): the kernel returns ``o_p`` and ``lse_p = log sum_t exp(s_t)``
   with ``s_t = scale * <q, k~_t>``, reading codes and norms only (values are accumulated in the rotated
   domain and rotated back once, see the kernel's docstring);
2. the 16-bit residual window of the cache (``residual_length``), and
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
What remains, named by :func:`fused_decode_unsupported` and served by the workspace path instead: MSE codes wider
than 4 bits (the kernels implement 1-4; TurboQuant_prod keys store ``bits - 1``-bit codes, so prod runs up to 5).

At run time a decode step also takes the torch path (decode the packed store, then ``sdpa``) when the
attention mask hides some cached token (left-padded batches: the kernel has no per-token mask) and for a
multi-token forward over a non-empty cache (chunked prefill); the prefill itself uses ``sdpa``. Without
Triton on the device (CPU without ``TRITON_INTERPRET=1``), a fused layer keeps the workspace and behaves
exactly as ``TurboQuantLayer``.

Usage (the model code is not forked: the attention function is registered with transformers'
``AttentionInterface`` and the model's ``_attn_implementation`` is switched for the block)::

    cache = build_cache("turboquant", model.config, key_bits=4, value_bits=4, fused_decode=True)
    with fused_decode(model, cache):
        out = model.generate(**inputs, past_key_values=cache, max_new_tokens=32, do_sample=False)
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

import turboquant as tq
from turboquant.kernels import triton_available
from turboquant.kvcache.base import CompressedCache
from turboquant.kvcache.stream import Fields
from turboquant.kvcache.turboquant_cache import (
    TurboQuantCacheConfig,
    TurboQuantLayer,
)

if TYPE_CHECKING:  # the kernel module imports Triton: at run time only where a kernel runs
    from turboquant.kernels.decode_attention import (
        CacheFormat,
        ChannelGroup,
        GroupFields,
    )

__all__ = [
    "FUSED_ATTENTION", "FusedTurboQuantLayer", "attention_path", "fused_decode",
    "fused_decode_unavailable", "fused_decode_unsupported", "register_fused_attention",
]

#: Name of the attention function in transformers' AttentionInterface / AttentionMaskInterface.
FUSED_ATTENTION = "turboquant_fused"
KERNEL_BITS = (1, 2, 3, 4)

_ACTIVE_CACHE: contextvars.ContextVar[CompressedCache | None] = contextvars.ContextVar("turboquant_fused_cache",
                                                                                        default=None)


def fused_decode_unsupported(config: TurboQuantCacheConfig) -> str | None:
    """None when the decode kernel computes attention for this configuration exactly, else the reason: a stream
    that is not TurboQuant codes (FP8 keys, uniform values) or an MSE code width above the kernels' 4 bits
    (TurboQuant_prod keys store ``bits - 1``-bit MSE codes and 1-bit QJL signs)."""
    if config.key_format != "turboquant" or config.value_format != "turboquant":
        return (f"key_format={config.key_format!r}, value_format={config.value_format!r}: the decode kernel reads "
                "TurboQuant codes only")
    qjl = int(config.key_variant == "prod")
    widths = [("key_bits", config.key_bits, qjl), ("value_bits", config.value_bits, 0)]
    if config.outlier_channels:
        widths.append(("outlier_key_bits", config.outlier_key_bits_resolved, qjl))
        if config.value_outliers:
            widths.append(("outlier_value_bits", config.outlier_value_bits_resolved, 0))
    for name, bits, qjl_bits in widths:
        if bits - qjl_bits > KERNEL_BITS[-1]:
            stored = f" ({bits - qjl_bits}-bit MSE codes + QJL signs)" if qjl_bits else ""
            return (f"{name}={bits}{stored}: the decode kernel reads MSE codes of "
                    f"{KERNEL_BITS[0]}-{KERNEL_BITS[-1]} bits")
    return None


@dataclass
class DecodeStep:
    """What one decode step of one layer attends over, captured before the new token was written."""

    key_fields: Fields | None      # packed store, tokens 0 .. quantized - 1 (None when empty)
    value_fields: Fields | None
    quantized: int
    exact_keys: torch.Tensor       # (B, kv_heads, r + 1, d): residual window + the new token, compute dtype
    exact_values: torch.Tensor


class FusedTurboQuantLayer(TurboQuantLayer):
    """A :class:`TurboQuantLayer` whose decode steps are answered by the fused kernel (module docstring).

    Storage and byte accounting are the parent's (the same packed fields, the same formula); there is no
    decoded workspace when the kernel is available.
    """

    def __init__(self, layer_idx: int, config: TurboQuantCacheConfig, fp_dtype: torch.dtype | None = None,
                 keep_workspace: bool = True) -> None:
        reason = fused_decode_unsupported(config)
        if reason is not None:
            raise ValueError(f"fused decode attention cannot serve this TurboQuant configuration: {reason}")
        super().__init__(layer_idx, config, fp_dtype, keep_workspace=keep_workspace)
        self.fallback_keep_workspace = keep_workspace  # the torch path's choice, used only without Triton
        self.fused = False
        self.defer_attention = False  # set by fused_decode() while the fused attention function is installed
        self.pending: DecodeStep | None = None
        self._format: CacheFormat | None = None  # the kernel's constants, built at the first decode step

    def _initialize(self) -> None:
        self.fused = triton_available(self.device)
        self.keep_workspace = self.fallback_keep_workspace and not self.fused
        super()._initialize()

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Decode steps under :func:`fused_decode`: write the token, return only the exact part (window + new
        token) and leave the packed part to the attention function; anything else: the parent's update."""
        _check_consumed(self)
        self.check_states(key_states, value_states)
        deferred = (self.is_initialized and self.fused and self.defer_attention and key_states.shape[-2] == 1
                    and self.stored_tokens() > 0)
        if not deferred:
            return super().update(key_states, value_states, *args, **kwargs)
        step = DecodeStep(self.key_stream.fields, self.value_stream.fields, self.key_stream.quantized_tokens,
                          self._exact(self.key_stream.residual, key_states),
                          self._exact(self.value_stream.residual, value_states))
        self._write(key_states, value_states)
        self.seen_tokens += 1
        self.pending = step
        return step.exact_keys, step.exact_values

    def _exact(self, residual: torch.Tensor | None, new: torch.Tensor) -> torch.Tensor:
        if residual is None or residual.shape[-2] == 0:
            return new
        return torch.cat([residual.to(new.dtype), new], dim=-2)

    # ------------------------------------------------------------------ attention
    def decode_step_attention(self, query: torch.Tensor, step: DecodeStep, scale: float) -> torch.Tensor:
        """Attention output (B, query_heads, d) float32 of the one-token ``query`` (B, query_heads, 1, d)."""
        q = query[:, :, 0].float()
        out_e, lse_e = _torch_attention(q, step.exact_keys, step.exact_values, scale)
        if step.quantized == 0:
            return out_e
        out_p, lse_p = self._packed_attention(q, step, scale)
        top = torch.maximum(lse_p, lse_e)
        w_p, w_e = torch.exp(lse_p - top), torch.exp(lse_e - top)
        return (w_p[..., None] * out_p + w_e[..., None] * out_e) / (w_p + w_e)[..., None]

    def _packed_attention(self, q: torch.Tensor, step: DecodeStep, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        from turboquant.kernels import decode_attention_groups_triton

        key_encoder, value_encoder = self.key_stream.encoder, self.value_stream.encoder
        cache_format = self._cache_format(q.device)
        seq_lens = torch.full((q.shape[0],), step.quantized, dtype=torch.int32, device=q.device)
        out, lse = decode_attention_groups_triton(
            q, _group_fields(step.key_fields, len(key_encoder.quantizers)),
            _group_fields(step.value_fields, len(value_encoder.quantizers)), seq_lens, cache_format,
            key_permutation=key_encoder.permutation, value_permutation=value_encoder.permutation, scale=scale,
            return_lse=True,
        )
        if key_encoder.key_mean is not None:  # <q, k~ + mu> = <q, k~> + <q, mu>: shifts lse only
            group = q.shape[1] // key_encoder.key_mean.shape[1]
            mean = key_encoder.key_mean.float().repeat_interleave(group, dim=1)
            lse = lse + scale * (q * mean).sum(-1)
        return out, lse

    def _cache_format(self, device: torch.device) -> CacheFormat:
        """The kernel's constants for this layer's quantizers (rotations, codebooks, QJL matrices and the query map
        derived from them), built once."""
        if self._format is None:
            from turboquant.kernels.decode_attention import CacheFormat

            self._format = CacheFormat.build(
                [_channel_group(quantizer) for quantizer in self.key_stream.encoder.quantizers],
                [_channel_group(quantizer) for quantizer in self.value_stream.encoder.quantizers], device)
        return self._format

    def full_past(self, step: DecodeStep) -> tuple[torch.Tensor, torch.Tensor]:
        """Decoded packed part + exact part (the torch path when the kernel cannot serve a step)."""
        if step.quantized == 0:
            return step.exact_keys, step.exact_values
        keys = self.key_stream.encoder.decode(step.key_fields).to(step.exact_keys.dtype)
        values = self.value_stream.encoder.decode(step.value_fields).to(step.exact_values.dtype)
        return torch.cat([keys, step.exact_keys], dim=-2), torch.cat([values, step.exact_values], dim=-2)


def _check_consumed(layer: FusedTurboQuantLayer) -> None:
    """RuntimeError if a deferred step's packed part was never attended to: the model's attention did not call
    :func:`fused_attention_forward` (a model that does not dispatch through transformers' AttentionInterface)."""
    if layer.pending is not None:
        layer.pending = None
        raise RuntimeError(f"layer {layer.layer_idx}: the attention function {FUSED_ATTENTION!r} never read the "
                           "packed cache of the last decode step; this model's attention does not dispatch "
                           "through transformers' AttentionInterface, so the fused path cannot serve it")


def _channel_group(quantizer: tq.TurboQuantMSE | tq.TurboQuantProd) -> ChannelGroup:
    """The kernel's description of one channel group's quantizer (MSE stage, and QJL stage for TurboQuant_prod)."""
    from turboquant.kernels.decode_attention import ChannelGroup

    rotation, codebook = quantizer.rotation, quantizer.codebook  # None for TurboQuant_prod at 1 bit (QJL alone)
    return ChannelGroup(
        dim=quantizer.dim, bits=quantizer.mse_bits,
        rotation=None if rotation is None else rotation.matrix(),
        centroids=None if codebook is None else codebook.centroids_tensor(quantizer.device),
        sketch=quantizer.qjl.matrix if isinstance(quantizer, tq.TurboQuantProd) else None,
    )


def _group_fields(fields: Fields, groups: int) -> list[GroupFields]:
    """The stored fields of each channel group (``codes{g}``, ``norms{g}``, ``signs{g}``, ``residual_norms{g}``)."""
    from turboquant.kernels.decode_attention import GroupFields

    return [GroupFields(fields[f"codes{g}"], fields[f"norms{g}"], fields.get(f"signs{g}"),
                        fields.get(f"residual_norms{g}")) for g in range(groups)]


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


def _hides_tokens(attention_mask: torch.Tensor | None) -> bool:
    """True when the mask excludes some key position (bool: False entries; additive float: negative entries)."""
    if attention_mask is None:
        return False
    if attention_mask.dtype == torch.bool:
        return not bool(attention_mask.all())
    return bool((attention_mask < 0).any())


def fused_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                            **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers attention function: the fused path for a pending decode step of the active cache's layer
    ``module.layer_idx``, ``sdpa`` for everything else (prefill, full-precision layers, other caches)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    cache = _ACTIVE_CACHE.get()
    layer_idx = getattr(module, "layer_idx", None)
    layer = cache.layers[layer_idx] if cache is not None and layer_idx is not None and layer_idx < len(cache.layers) else None
    step = getattr(layer, "pending", None)
    if step is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    layer.pending = None
    if _hides_tokens(attention_mask):  # padded rows: the kernel has no per-token mask
        keys, values = layer.full_past(step)
        return sdpa_attention_forward(module, query, keys, values, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    out = layer.decode_step_attention(query, step, scale)
    return out.to(query.dtype)[:, None], None  # (B, 1, heads, d), as the model's reshape expects


def register_fused_attention() -> None:
    """Register :func:`fused_attention_forward` (and sdpa's mask builder) under :data:`FUSED_ATTENTION`."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(FUSED_ATTENTION, fused_attention_forward)
    AttentionMaskInterface.register(FUSED_ATTENTION, sdpa_mask)


@contextlib.contextmanager
def fused_decode(model: torch.nn.Module, cache: CompressedCache) -> Iterator[CompressedCache]:
    """Within the block, ``model``'s attention reads ``cache``'s fused layers through the kernel (decode steps)."""
    register_fused_attention()
    fused_layers = [layer for layer in cache.layers if isinstance(layer, FusedTurboQuantLayer)]
    previous = model.config._attn_implementation
    model.set_attn_implementation(FUSED_ATTENTION)
    token = _ACTIVE_CACHE.set(cache)
    for layer in fused_layers:
        layer.defer_attention = True
    try:
        yield cache
        for layer in fused_layers:
            _check_consumed(layer)
    finally:
        for layer in fused_layers:
            layer.defer_attention = False
            layer.pending = None
        _ACTIVE_CACHE.reset(token)
        model.set_attn_implementation(previous)


def fused_decode_unavailable(cache: CompressedCache, device: torch.device | str) -> str | None:
    """None when ``cache``, rebuilt with ``fused_decode=True``, would answer decode steps on ``device`` through
    the kernel; otherwise why not: no Triton kernel on the device (CUDA, or ``TRITON_INTERPRET=1``), no
    TurboQuant layer in the cache (another method), or the configuration's reason from
    :func:`fused_decode_unsupported`."""
    if not triton_available(device):
        return f"the Triton kernels cannot run on {device} (CUDA with Triton, or TRITON_INTERPRET=1)"
    quantized = [layer for layer in cache.layers if isinstance(layer, TurboQuantLayer)]
    if not quantized:
        return f"the {cache.method!r} cache has no TurboQuant layer"
    return fused_decode_unsupported(quantized[0].config)


def attention_path(cache: CompressedCache) -> str:
    """``"fused"`` when the cache's decode steps read the packed store through the kernel (a fused layer on a
    device with Triton), ``"workspace"`` when the model's own attention reads the tensors the cache returns
    (the decoded workspace of a quantizer, the 16-bit store of the full and eviction caches). Decided per
    layer at its first update, so ask after the prefill."""
    return "fused" if any(getattr(layer, "fused", False) for layer in cache.layers) else "workspace"
