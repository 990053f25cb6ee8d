"""One ``transformers.Cache`` class per method, built from a model config as transformers' own caches are.

``TurboQuantCache(model.config, bits=3.5)`` reads like ``transformers.QuantizedCache(backend, model.config,
nbits=4)``: the model's config gives the shape (layers, KV heads, head dimension), the keywords are the
method's options — exactly the ``options:`` of ``configs/method/*.yaml`` and of
``build_cache(method, model.config, **options)``, which each class calls (see
:mod:`turboquant.kvcache.factory` for every option). The cache goes to ``generate`` as any other::

    cache = TurboQuantCache(model.config, bits=3.5)
    out = model.generate(**inputs, cache=cache, max_new_tokens=32)   # or the older past_key_values=cache
    cache.memory_ratio(), cache.bits_per_value()

A cache holds one conversation: build a new one per prompt. The eviction caches (:class:`SnapKVCache`,
:class:`PyramidKVCache`) also need the prefill's window queries: run ``generate`` inside
``with turboquant.kvcache.attach(model, cache):`` (without it their prefill raises ``ValueError`` saying so).
"""

from __future__ import annotations

from typing import Any, ClassVar

from turboquant.kvcache.base import CompressedCache
from turboquant.kvcache.factory import build_cache

__all__ = ["FullCache", "KIVICache", "PolarQuantCache", "PyramidKVCache", "SnapKVCache", "TurboQuantCache"]


class _MethodCache(CompressedCache):
    """The cache ``build_cache(METHOD, config, **options)`` builds, as an instance of this class."""

    METHOD: ClassVar[str]

    def __init__(self, config: Any, **options: Any) -> None:
        built = build_cache(self.METHOD, config, **options)
        super().__init__(built.layers, method=built.method, options=built.options)


class FullCache(_MethodCache):
    """The model's own cache at 16 bits (the reference every memory ratio is measured against); ``fp_dtype``."""

    METHOD = "full"


class TurboQuantCache(_MethodCache):
    """TurboQuant (the paper's KV cache): ``bits=3.5`` / ``2.5`` presets (outlier channels at one bit more),
    integer ``bits``, ``memory_ratio=``, or ``key_bits``/``value_bits``, ``key_variant`` (mse|prod),
    ``residual_length``, ``rotation``, ``seed``, ``center_keys``, ``fused_decode`` (see
    :mod:`turboquant.kvcache.turboquant_cache`)."""

    METHOD = "turboquant"


class KIVICache(_MethodCache):
    """KIVI (Liu et al. 2024): ``bits`` or ``memory_ratio``, ``group_size`` (32), ``residual_length`` (128)."""

    METHOD = "kivi"


class PolarQuantCache(_MethodCache):
    """PolarQuant (Han et al. 2025): ``level_bits`` ((4, 2, 2, 2)) or ``memory_ratio``, ``rotation``, ``seed``,
    ``residual_length``."""

    METHOD = "polarquant"


class SnapKVCache(_MethodCache):
    """SnapKV (Li et al. 2024): ``budget`` or ``memory_ratio``, ``window_size``, ``kernel_size``, ``pooling``;
    needs ``attach(model, cache)`` around ``generate``."""

    METHOD = "snapkv"


class PyramidKVCache(_MethodCache):
    """PyramidKV (Cai et al. 2024): SnapKV's options and ``beta`` (20); needs ``attach(model, cache)``."""

    METHOD = "pyramidkv"
