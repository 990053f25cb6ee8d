"""One interface for every maximum-inner-product-search (MIPS) index in the suite.

TurboQuant (paper §4.4, Fig. 5 / Table 2 of arXiv v1) and its baselines (product quantization, RaBitQ,
exact search) all implement :class:`VectorIndex`:

* ``train(x)``   learn whatever the method learns from data (a no-op for the data-oblivious TurboQuant),
* ``add(x)``     encode database vectors (rows of ``x``, shape ``(n, dim)``) and append them,
* ``search(q, k)`` return the ``k`` database rows with the largest *estimated* inner product ⟨q, x⟩,
* ``nbytes``     bytes of the per-vector database representation (codes plus per-vector scalars such as
  norms); method-wide state that does not grow with the database (a rotation matrix, PQ centroids) is
  reported separately as ``model_nbytes``,
* ``save(path)`` / :func:`turboquant.ann.load_index` a single ``.npz`` file (no pickle).

Every array crosses the interface as NumPy: float32 in, ``(scores float32, ids int64)`` out, so indexes
built on different libraries are directly comparable.
"""

from __future__ import annotations

import abc
import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from turboquant.quantizers import all_finite

__all__ = ["SearchResult", "VectorIndex", "as_float_matrix", "check_k"]


@dataclass(frozen=True)
class SearchResult:
    """Top-k answer of a batch of queries: row i holds query i's hits, best (largest score) first."""

    scores: np.ndarray  # (n_queries, k) float32, non-increasing along each row
    ids: np.ndarray  # (n_queries, k) int64, positions in insertion order

    def __iter__(self):  # allows ``scores, ids = index.search(q, k)``
        return iter((self.scores, self.ids))


def as_float_matrix(x: Any, dim: int, name: str) -> np.ndarray:
    """Validate ``x`` as a finite ``(n, dim)`` matrix and return it as C-contiguous float32.

    Accepts NumPy arrays and CPU/GPU torch tensors (copied to host). Raises ``ValueError`` naming ``name``
    for a wrong rank, a wrong dimension, zero rows or a non-finite entry.
    """
    if isinstance(x, torch.Tensor):
        x = x.detach().float().cpu().numpy()
    array = np.asarray(x)
    if array.ndim != 2:
        raise ValueError(f"{name} must be a 2-D (n, {dim}) matrix, got shape {array.shape}")
    if array.shape[1] != dim:
        raise ValueError(f"{name} has dimension {array.shape[1]}, but the index was built for dim={dim}")
    if array.shape[0] == 0:
        raise ValueError(f"{name} has no rows")
    if not np.issubdtype(array.dtype, np.floating):
        raise ValueError(f"{name} must hold floating-point values, got dtype {array.dtype}")
    array = np.ascontiguousarray(array, dtype=np.float32)
    with warnings.catch_warnings():  # a read-only array (np.load mmap) is only read here
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        finite = all_finite(torch.from_numpy(array))
    if not finite:
        raise ValueError(f"{name} contains NaN or infinite values")
    return array


def check_k(k: int, ntotal: int) -> int:
    """``k`` must be a positive integer no larger than the number of indexed vectors."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise ValueError(f"k must be an integer, got {k!r}")
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    if ntotal == 0:
        raise ValueError("the index is empty: add() vectors before search()")
    if k > ntotal:
        raise ValueError(f"k={k} exceeds the number of indexed vectors ({ntotal})")
    return int(k)


class VectorIndex(abc.ABC):
    """Abstract maximum-inner-product index (see the module docstring for the contract)."""

    #: key of the index class, stored in saved files (``"turboquant"``, ``"pq"``, ...)
    method: ClassVar[str]
    #: whether :meth:`train` must be called before :meth:`add`
    requires_training: ClassVar[bool] = False

    def __init__(self, dim: int, bits: int | None) -> None:
        if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 1:
            raise ValueError(f"dim must be a positive integer, got {dim!r}")
        if bits is not None and (isinstance(bits, bool) or not isinstance(bits, (int, np.integer)) or bits < 1):
            raise ValueError(f"bits must be a positive integer, got {bits!r}")
        self.dim = int(dim)
        self.bits = None if bits is None else int(bits)
        self.is_trained = not self.requires_training

    # ---------------------------------------------------------------- properties
    @property
    def name(self) -> str:
        """Method name as :func:`turboquant.ann.make_index` takes it (e.g. ``"turboquant_mse"``, ``"pq"``)."""
        return self.method

    @property
    @abc.abstractmethod
    def ntotal(self) -> int:
        """Number of indexed database vectors."""

    @property
    @abc.abstractmethod
    def nbytes(self) -> int:
        """Bytes of the per-vector database representation (codes + per-vector scalars), all vectors."""

    @property
    def model_nbytes(self) -> int:
        """Bytes of method-wide state that does not grow with the database (0 unless overridden)."""
        return 0

    @property
    def bits_per_coordinate(self) -> float:
        """Storage actually spent per database coordinate, ``8·nbytes / (ntotal·dim)``."""
        if self.ntotal == 0:
            raise ValueError("bits_per_coordinate is undefined for an empty index")
        return 8.0 * self.nbytes / (self.ntotal * self.dim)

    # ---------------------------------------------------------------- operations
    def train(self, x: Any) -> None:
        """Learn from ``x`` (n, dim). Data-oblivious methods only validate the input."""
        x = as_float_matrix(x, self.dim, "training data")
        self._train(x)
        self.is_trained = True

    def _train(self, x: np.ndarray) -> None:  # noqa: B027 - optional hook, data-oblivious by default
        """Method-specific training; the default learns nothing."""

    def add(self, x: Any) -> None:
        """Encode the rows of ``x`` (n, dim) and append them; ids continue from ``ntotal``."""
        if not self.is_trained:
            raise ValueError(f"{type(self).__name__} must be trained (train(x)) before add()")
        self._add(as_float_matrix(x, self.dim, "database vectors"))

    def search(self, queries: Any, k: int) -> SearchResult:
        """Top-``k`` database rows by estimated inner product for each query row (best first)."""
        k = check_k(k, self.ntotal)
        queries = as_float_matrix(queries, self.dim, "queries")
        scores, ids = self._search(queries, k)
        return SearchResult(np.ascontiguousarray(scores, dtype=np.float32), np.ascontiguousarray(ids, dtype=np.int64))

    @abc.abstractmethod
    def _add(self, x: np.ndarray) -> None:
        """Encode validated float32 rows."""

    @abc.abstractmethod
    def _search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Search validated float32 queries with a validated ``k``."""

    # ---------------------------------------------------------------- persistence
    @abc.abstractmethod
    def config(self) -> dict[str, Any]:
        """JSON-serialisable constructor arguments (``type(self)(**config())`` rebuilds an empty index)."""

    @abc.abstractmethod
    def state_arrays(self) -> dict[str, np.ndarray]:
        """Arrays that, together with :meth:`config`, restore the index exactly."""

    @abc.abstractmethod
    def load_state_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        """Inverse of :meth:`state_arrays` on an index freshly built from the same config."""

    def save(self, path: str | Path) -> Path:
        """Write the index to one ``.npz`` file (metadata as JSON, arrays as-is); returns the path."""
        path = Path(path)
        if path.suffix != ".npz":
            path = path.with_suffix(path.suffix + ".npz")
        path.parent.mkdir(parents=True, exist_ok=True)
        meta = {"method": self.method, "config": self.config(), "is_trained": self.is_trained}
        arrays = self.state_arrays()
        if "meta" in arrays:
            raise ValueError("'meta' is reserved in saved index files")
        np.savez(path, meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), **arrays)
        return path

    def __repr__(self) -> str:
        return f"{type(self).__name__}(dim={self.dim}, bits={self.bits}, ntotal={self.ntotal})"
