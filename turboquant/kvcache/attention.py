"""The one way a model hands its attention to a cache of this package: ``attach(model, cache)``.

transformers' attention modules (Llama, Mistral, Qwen2/3, ...) compute the RoPE-applied queries, keys and values,
call ``cache.update(key, value, layer_idx)``, then the function registered under ``config._attn_implementation``
in ``AttentionInterface``: ``attention(module, query, key, value, attention_mask, scaling=..., dropout=...)``.
:func:`attach` registers :func:`cache_attention` under :data:`CACHE_ATTENTION` (with the mask builder of the
model's own implementation in ``AttentionMaskInterface``) and switches the model to it for the block, so every
attention call reaches ``cache.attend(layer_idx, ...)``, i.e. the layer's
:meth:`~turboquant.kvcache.base.CompressedLayer.attend`, with the query the model itself computed and the
model's own attention function (the implementation it had: ``sdpa``, ``eager``, ...) to delegate to:

- most layers (full precision, KIVI, PolarQuant, the TurboQuant workspace) let the model's function attend over
  what ``update`` returned, so their numbers are those of the model without ``attach``;
- SnapKV / PyramidKV layers take the queries of their observation window from the prefill's call and evict
  there (no projection is recomputed, no model code forked);
- a TurboQuant layer built with ``fused_decode`` answers its decode steps from the packed codes through the
  Triton kernel (:mod:`turboquant.kvcache.fused_attention`).

Usage::

    cache = build_cache("snapkv", model.config)        # any method
    with attach(model, cache):
        out = model.generate(**inputs, past_key_values=cache, max_new_tokens=32, do_sample=False)

The model's implementation is restored on exit. Models whose attention does not dispatch through
``AttentionInterface`` cannot be served (the eviction layers then raise at the prefill, the fused layers at
their next step).
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from turboquant.kvcache.base import AttentionFn, CompressedCache

__all__ = ["CACHE_ATTENTION", "attach", "cache_attention"]

#: Name of :func:`cache_attention` in transformers' AttentionInterface (suffixed by the model's own
#: implementation in AttentionMaskInterface, whose mask builder it keeps).
CACHE_ATTENTION = "turboquant_cache"


@dataclass(frozen=True)
class _Attachment:
    cache: CompressedCache
    implementation: str  # the model's own attention implementation, which the layers delegate to


_ACTIVE: contextvars.ContextVar[_Attachment | None] = contextvars.ContextVar("turboquant_attachment", default=None)


def own_attention(implementation: str, module: torch.nn.Module) -> AttentionFn:
    """The function transformers would call for ``module`` under ``implementation`` (``eager`` is defined in
    the model's own modeling module, every other one is registered in ``AttentionInterface``)."""
    from transformers import AttentionInterface

    if implementation != "eager":
        return AttentionInterface()[implementation]
    eager = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    if eager is None:
        raise ValueError(f"{type(module).__name__}'s module defines no eager_attention_forward to delegate to")
    return eager


def cache_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """transformers attention function: the attached cache's layer ``module.layer_idx`` answers the call."""
    active = _ACTIVE.get()
    if active is None:
        raise RuntimeError(f"the {CACHE_ATTENTION!r} attention function runs only inside "
                           "turboquant.kvcache.attach(model, cache)")
    attention = own_attention(active.implementation, module)
    layer_idx = getattr(module, "layer_idx", None)
    if layer_idx is None or not 0 <= layer_idx < len(active.cache.layers):  # not a decoder layer of this cache
        return attention(module, query, key, value, attention_mask, **kwargs)
    return active.cache.attend(layer_idx, module, query, key, value, attention_mask, attention, **kwargs)


def _register(implementation: str) -> str:
    """Register :func:`cache_attention`, and the mask builder of ``implementation`` under the name returned."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    name = f"{CACHE_ATTENTION}_{implementation}"
    if implementation not in ALL_MASK_ATTENTION_FUNCTIONS:
        raise ValueError(f"attention implementation {implementation!r} has no mask builder in transformers' "
                         "AttentionMaskInterface to keep")
    AttentionInterface.register(name, cache_attention)
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[implementation])
    return name


@contextlib.contextmanager
def attach(model: torch.nn.Module, cache: CompressedCache) -> Iterator[CompressedCache]:
    """Within the block, every attention call of ``model`` is answered by ``cache``'s layers (module docstring)."""
    if not isinstance(cache, CompressedCache):
        raise TypeError(f"attach() takes a cache of turboquant.kvcache (build_cache), got {type(cache).__name__}")
    previous = model.config._attn_implementation
    if _ACTIVE.get() is not None or previous.startswith(CACHE_ATTENTION):
        raise RuntimeError("attach() blocks do not nest: one cache answers a model's attention at a time")
    for layer in cache.layers:
        layer.check_attention(previous)
    model.set_attn_implementation(_register(previous))
    token = _ACTIVE.set(_Attachment(cache, previous))
    for layer in cache.layers:
        layer.attached = True
    try:
        yield cache
    finally:
        unattended = [message for layer in cache.layers if (message := layer.detach()) is not None]
        _ACTIVE.reset(token)
        model.set_attn_implementation(previous)
    if unattended:
        raise RuntimeError(unattended[0])
