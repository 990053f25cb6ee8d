"""Quantized and compressed KV caches for Hugging Face ``transformers`` models.

``build_cache(method, model.config, **options)`` gives a real ``transformers.Cache`` for ``full``,
``turboquant``, ``kivi``, ``polarquant``, ``snapkv`` or ``pyramidkv`` (see :mod:`turboquant.kvcache.factory`
for the three-line usage); every cache reports ``nbytes()``, ``memory_ratio()``, ``compression_ratio()`` and
``bits_per_value()`` against the model's 16-bit cache. Importing a method module registers it.
The same caches as transformers-style classes (``TurboQuantCache(model.config, bits=3.5)``, ``KIVICache``, ...):
:mod:`turboquant.kvcache.hf`.
"""

from turboquant.kvcache.attention import attach
from turboquant.kvcache.base import CompressedCache, CompressedLayer
from turboquant.kvcache.eviction import EvictionLayer
from turboquant.kvcache.factory import ModelShape, available_methods, build_cache, register_method
from turboquant.kvcache.full import FullPrecisionLayer
from turboquant.kvcache.hf import (FullCache, KIVICache, PolarQuantCache, PyramidKVCache, SnapKVCache,
                                   TurboQuantCache)
from turboquant.kvcache.kivi import KIVILayer
from turboquant.kvcache.polarquant import PolarQuantLayer
from turboquant.kvcache.turboquant_cache import (VLLM_PRESETS, TurboQuantCacheConfig, TurboQuantLayer,
                                                 nominal_bits_per_value, turboquant_preset)

__all__ = [
    "VLLM_PRESETS", "CompressedCache", "CompressedLayer", "EvictionLayer", "FullCache", "FullPrecisionLayer",
    "KIVICache", "KIVILayer", "ModelShape", "PolarQuantCache", "PolarQuantLayer", "PyramidKVCache", "SnapKVCache",
    "TurboQuantCache", "TurboQuantCacheConfig", "TurboQuantLayer", "attach", "available_methods", "build_cache",
    "nominal_bits_per_value", "register_method", "turboquant_preset",
]
