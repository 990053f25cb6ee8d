"""Quantized and compressed KV caches for Hugging Face ``transformers`` models.

``build_cache(method, model.config, **options)`` gives a real ``transformers.Cache`` (see
:mod:`turboquant.kvcache.factory` for the three-line usage); every cache reports ``nbytes()``,
``memory_ratio()``, ``compression_ratio()`` and ``bits_per_value()`` against the model's 16-bit cache.
"""

from turboquant.kvcache.base import CompressedCache, CompressedLayer
from turboquant.kvcache.factory import ModelShape, attach, available_methods, build_cache, register_method
from turboquant.kvcache.full import FullPrecisionLayer

__all__ = [
    "CompressedCache",
    "CompressedLayer",
    "FullPrecisionLayer",
    "ModelShape",
    "attach",
    "available_methods",
    "build_cache",
    "register_method",
]

# Importing the method modules registers them with the factory.
from turboquant.kvcache import eviction as _eviction  # noqa: E402,F401
from turboquant.kvcache import kivi as _kivi  # noqa: E402,F401
from turboquant.kvcache import polarquant as _polarquant  # noqa: E402,F401
from turboquant.kvcache import turboquant_cache as _turboquant_cache  # noqa: E402,F401
