"""Nearest-neighbour (maximum inner product) search: TurboQuant and its baselines behind one interface.

    from turboquant.ann import make_index, load_index, recall_at_1_at_k
    index = make_index("turboquant_mse", dim=1536, bits=4)      # or "pq", "pq_fastscan", "rabitq", "exact"
    index.train(base)          # no-op for TurboQuant (data-oblivious); k-means / centroid for the baselines
    index.add(base)
    scores, ids = index.search(queries, k=64)
    index.save("index.npz"); same = load_index("index.npz")

The faiss-backed baselines import faiss (an optional dependency) only when first requested.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from turboquant.ann.base import SearchResult, VectorIndex
from turboquant.ann.recall import powers_of_two_up_to, recall_at_1_at_k
from turboquant.ann.turboquant_index import TurboQuantIndex

__all__ = [
    "METHODS",
    "SearchResult",
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
    """Rebuild an index written by :meth:`VectorIndex.save`."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no saved index at {path}")
    with np.load(path, allow_pickle=False) as saved:
        arrays = {key: saved[key] for key in saved.files}
    if "meta" not in arrays:
        raise ValueError(f"{path} is not a saved index (no 'meta' entry)")
    meta = json.loads(arrays.pop("meta").tobytes().decode())
    if meta.get("method") not in _CLASSES:
        raise ValueError(f"{path} holds an index of unknown method {meta.get('method')!r}")
    index = _index_class(meta["method"])(**meta["config"])
    index.load_state_arrays(arrays)
    index.is_trained = bool(meta["is_trained"])
    return index
