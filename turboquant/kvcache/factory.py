"""Build any KV cache of this package from a method name and a model config.

Usage (the whole API the experiments need)::

    from turboquant.kvcache import attach, build_cache

    cache = build_cache("turboquant", model.config, bits=3.5)   # "full", "turboquant", "kivi", "polarquant",
    with attach(model, cache):                                   # "snapkv", "pyramidkv"
        out = model.generate(**inputs, past_key_values=cache, max_new_tokens=32, do_sample=False)
    print(cache.memory_ratio(), cache.bits_per_value(), cache.summary())

Build a new cache for every prompt (a cache holds one conversation, batch size fixed at its first update).
``attach`` (:mod:`turboquant.kvcache.attention`) routes the model's attention calls to the cache: the eviction
methods (SnapKV, PyramidKV) read their window queries there and fused TurboQuant layers answer decode steps
there; the other methods attend exactly as the model does without it, so always using it is safe.

Matched memory: ``build_cache(method, model.config, memory_ratio=0.25, context_length=n)`` works for every
compressed method. The quantizers pick the costliest configuration whose true ratio (codes, norms, scales,
indices and their 16-bit windows at ``n`` tokens; steady state if ``context_length`` is omitted) is at most
the target; the eviction methods keep ``floor(0.25 * prompt_tokens)`` tokens per layer (on average for
PyramidKV). ``full`` takes no memory option. Every cache reports its measured ratio afterwards.

Method options (see each module's docstring for the scheme and its byte formula):

- ``turboquant``: ``bits`` (integer, or ``b + 0.5`` presets), or ``key_bits``/``value_bits``,
  ``key_variant`` (mse|prod), ``outlier_channels``, ``outlier_key_bits``/``outlier_value_bits``, ``value_outliers``,
  ``residual_length``, ``boundary_layers``, ``rotation`` (haar|hadamard), ``seed``, ``center_keys``
  (quantize keys minus their prefill mean; exact for attention), ``decode_fn``, ``fused_decode`` (the read path:
  ``True`` = decode steps read the packed codes through the Triton kernel, ``"auto"`` = where the kernel serves
  the configuration, ``False`` = the decoded workspace; see :mod:`turboquant.kvcache.fused_attention`);
- ``kivi``: ``bits`` (1-8), ``group_size`` (32), ``residual_length`` (128);
- ``polarquant``: ``level_bits`` ((4, 2, 2, 2)), ``rotation``, ``seed``, ``residual_length`` (0);
- ``snapkv``: ``budget`` (tokens per layer) or ``memory_ratio`` (0.25), ``window_size`` (32),
  ``kernel_size`` (7), ``pooling`` (maxpool|avgpool); ``pyramidkv``: the same and ``beta`` (20);
- all: ``fp_dtype`` (16-bit storage dtype of full-precision parts; default fp16, or the model's 16-bit
  dtype), and for the quantizers ``keep_workspace`` (see :mod:`turboquant.kvcache.stream`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from turboquant.kvcache.base import CompressedCache
from turboquant.kvcache.full import FullPrecisionLayer


@dataclass(frozen=True)
class ModelShape:
    """What a cache needs to know about the model: layer count, KV heads and head dimension."""

    num_layers: int
    num_kv_heads: int
    head_dim: int

    @classmethod
    def from_config(cls, model_config: Any) -> ModelShape:
        config = model_config.get_text_config(decoder=True) if hasattr(model_config, "get_text_config") else model_config
        try:
            num_layers = int(config.num_hidden_layers)
            num_heads = int(config.num_attention_heads)
        except AttributeError as error:
            raise ValueError(f"model config lacks {error.name}: need num_hidden_layers and num_attention_heads") from error
        num_kv_heads = int(getattr(config, "num_key_value_heads", None) or num_heads)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // num_heads
        return cls(num_layers=num_layers, num_kv_heads=num_kv_heads, head_dim=int(head_dim))


def _build_full(shape: ModelShape, fp_dtype: torch.dtype | None = None) -> CompressedCache:
    """The 16-bit reference cache (takes no memory option: its ratio is 1 by definition)."""
    layers = [FullPrecisionLayer(index, fp_dtype=fp_dtype) for index in range(shape.num_layers)]
    return CompressedCache(layers, method="full", options={})


_BUILDERS: dict[str, Callable[..., CompressedCache]] = {"full": _build_full}


def register_method(name: str, builder: Callable[..., CompressedCache]) -> None:
    """Register ``builder(shape: ModelShape, **options) -> CompressedCache`` under ``name``."""
    _BUILDERS[name] = builder


def available_methods() -> list[str]:
    return sorted(_BUILDERS)


def build_cache(method: str, model_config: Any, **options: Any) -> CompressedCache:
    """A fresh cache of ``method`` for a model with ``model_config`` (a transformers config or ModelShape).

    Options are those of the method's builder (see each module); unknown names raise ``ValueError``.
    ``context_length`` (the prompt length, when known) and ``max_new_tokens`` let the quantizers count their 16-bit
    windows at the peak of a generation when choosing a configuration for ``memory_ratio``; builders that do not
    use them (the eviction methods measure the prompt itself) do not receive them.
    """
    if method not in _BUILDERS:
        raise ValueError(f"unknown KV cache method {method!r}; available: {available_methods()}")
    shape = model_config if isinstance(model_config, ModelShape) else ModelShape.from_config(model_config)
    builder = _BUILDERS[method]
    for length in ("context_length", "max_new_tokens"):  # only the budget-fitting builders use the lengths
        if length not in inspect.signature(builder).parameters:
            options.pop(length, None)
    try:
        cache = builder(shape, **options)
    except TypeError as error:
        raise ValueError(f"bad options for KV cache method {method!r}: {error}") from error
    for layer in cache.layers:
        layer.model_head_dim = shape.head_dim
    return cache
