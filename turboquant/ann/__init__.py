"""Nearest-neighbour (maximum inner product) search: TurboQuant and its baselines behind one interface.

    from turboquant.ann import make_index, load_index, recall_at_1_at_k
    index = make_index("turboquant_mse", dim=1536, bits=4)      # or "pq", "pq_fastscan", "rabitq", "exact"
    index.train(base)          # no-op for TurboQuant (data-oblivious); k-means / centroid for the baselines
    index.add(base)
    D, I = index.search(queries, 64)    # faiss's convention: scores and labels, best first
    index.save("index.npz"); same = load_index("index.npz")

The faiss-backed baselines import faiss (an optional dependency) only when first requested.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from turboquant.ann.base import TrainingSizeWarning, VectorIndex
from turboquant.ann.index_file import IndexFileError, read_index_file
from turboquant.ann.recall import powers_of_two_up_to, recall_at_1_at_k
from turboquant.ann.turboquant_index import TurboQuantIndex

__all__ = [
    "METHODS",
    "IndexFileError",
    "TrainingSizeWarning",
    "TurboQuantIndex",
    "VectorIndex",
    "load_index",
    "make_index",
    "powers_of_two_up_to",
    "recall_at_1_at_k",
]

#: ``VectorIndex.method`` (the key stored in saved files) -> class name
_CLASSES: dict[str, str] = {
    "turboquant": "TurboQuantIndex",
    "pq": "PQIndex",
    "pq_fastscan": "PQFastScanIndex",
    "rabitq": "RaBitQIndex",
    "exact": "ExactIndex",
}

#: method name accepted by :func:`make_index` -> (``VectorIndex.method``, fixed constructor arguments)
METHODS: dict[str, tuple[str, dict[str, Any]]] = {
    "turboquant_mse": ("turboquant", {"variant": "mse"}),
    "turboquant_prod": ("turboquant", {"variant": "prod"}),
    "pq": ("pq", {}),
    "pq_fastscan": ("pq_fastscan", {}),
    "rabitq": ("rabitq", {}),
    "exact": ("exact", {}),
}


def _index_class(method: str) -> type[VectorIndex]:
    if method == TurboQuantIndex.method:
        return TurboQuantIndex
    from turboquant.ann import faiss_indexes  # imports faiss

    return getattr(faiss_indexes, _CLASSES[method])


def make_index(method: str, dim: int, bits: int | None = None, **options: Any) -> VectorIndex:
    """A new, empty index of ``method`` (one of :data:`METHODS`) with ``options`` for its constructor."""
    if method not in METHODS:
        raise ValueError(f"unknown index method {method!r}; choose from {sorted(METHODS)}")
    class_method, fixed = METHODS[method]
    clash = set(fixed) & set(options)
    if clash:
        raise ValueError(f"method {method!r} fixes {sorted(clash)}; do not pass them")
    return _index_class(class_method)(dim, bits, **fixed, **options)


def load_index(path: str | Path) -> VectorIndex:
    """Rebuild an index written by :meth:`VectorIndex.save`.

    Raises :class:`IndexFileError` (a ``ValueError`` naming the file) for an unreadable, edited or
    inconsistent file: see :mod:`turboquant.ann.index_file`; the arrays are checked against the saved
    config (``check_saved``) before the index is constructed."""
    meta, arrays = read_index_file(path)
    method = meta["method"]
    if method not in _CLASSES:
        raise IndexFileError(f"{path} holds an index of unknown method {method!r}; known: {sorted(_CLASSES)}")
    labels = arrays.pop("labels", None)
    cls = _index_class(method)
    try:
        cls.check_saved(meta["config"], arrays)
        index = cls(**meta["config"])
        index.load_state_arrays(arrays)
        if labels is not None:
            if labels.dtype != np.int64 or labels.shape != (index.ntotal,) or len(np.unique(labels)) != index.ntotal:
                raise ValueError(f"'labels' must be {index.ntotal} distinct int64 values, got {labels.dtype} {labels.shape}")
            index._labels = labels
    except (TypeError, ValueError, RuntimeError) as error:
        raise IndexFileError(f"{path}: saved {method} index is invalid: {error}") from None
    index.is_trained = meta["is_trained"]
    return index
