"""One interface for every maximum-inner-product-search (MIPS) index in the suite, shaped like faiss's.

TurboQuant (paper §4.4, Fig. 5 / Table 2 of arXiv v1) and its baselines (product quantization, RaBitQ,
exact search) all implement :class:`VectorIndex`, with faiss's names and return values:

* ``train(x)``            learn whatever the method learns (a no-op for the data-oblivious TurboQuant),
* ``add(x)`` / ``add_with_ids(x, ids)``  encode database vectors (rows of ``x``, shape ``(n, d)``) and
  append them, labelled ``ntotal, ntotal + 1, …`` or by the given int64 ``ids``,
* ``D, I = search(x, k)`` the ``k`` rows with the largest *estimated* inner product ⟨q, x⟩ per query, best
  first: a plain tuple of scores ``D`` (float32) and labels ``I`` (int64), NumPy for NumPy input and torch
  tensors on the input's device for torch input,
* ``lims, D, I = range_search(x, radius)`` every row whose estimated inner product exceeds ``radius``
  (faiss's layout: query i's hits are ``D[lims[i]:lims[i+1]]``, here best first),
* ``remove_ids(ids)``, ``reconstruct(label)``, ``reset()``, ``ntotal``, ``d``,
* ``nbytes``  bytes of the per-vector database representation (codes plus per-vector scalars such as
  norms); method-wide state that does not grow with the database (a rotation matrix, PQ centroids) is
  reported separately as ``model_nbytes``,
* ``save(path)`` / :func:`turboquant.ann.load_index` a single ``.npz`` file (no pickle).

Labels: an index filled by ``add`` alone labels rows by position; ``add_with_ids`` or ``remove_ids`` keep a
position → label array, as faiss's ``IndexIDMap`` does.
"""

from __future__ import annotations

import abc
import json
import warnings
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from turboquant.quantizers import all_finite

__all__ = ["TrainingSizeWarning", "VectorIndex", "as_float_matrix", "as_float_tensor", "check_k"]


def as_float_tensor(x: Any, dim: int, name: str) -> torch.Tensor:
    """Validate ``x`` as a finite ``(n, dim)`` floating-point matrix; return a C-contiguous float32 tensor
    on ``x``'s device (NumPy input is wrapped without a copy when already float32 and contiguous).

    Raises ``ValueError`` naming ``name`` for a wrong rank, a wrong dimension, zero rows, a non-floating
    dtype or a non-finite entry.
    """
    if not isinstance(x, torch.Tensor):
        array = np.asarray(x)
        if not np.issubdtype(array.dtype, np.floating):
            raise ValueError(f"{name} must hold floating-point values, got dtype {array.dtype}")
        if not array.flags.writeable:  # torch cannot wrap a read-only array (e.g. np.load's mmap)
            array = array.copy()
        x = torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32) if array.ndim else array)
    elif not x.dtype.is_floating_point:
        raise ValueError(f"{name} must hold floating-point values, got dtype {x.dtype}")
    if x.ndim != 2:
        raise ValueError(f"{name} must be a 2-D (n, {dim}) matrix, got shape {tuple(x.shape)}")
    if x.shape[1] != dim:
        raise ValueError(f"{name} has dimension {x.shape[1]}, but the index was built for dim={dim}")
    if x.shape[0] == 0:
        raise ValueError(f"{name} has no rows")
    x = x.detach().to(torch.float32).contiguous()
    if not all_finite(x):
        raise ValueError(f"{name} contains NaN or infinite values")
    return x


def as_float_matrix(x: Any, dim: int, name: str) -> np.ndarray:
    """:func:`as_float_tensor`, returned as a host float32 NumPy array."""
    return as_float_tensor(x, dim, name).cpu().numpy()


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


def _check_ids(ids: Any, count: int | None, name: str) -> np.ndarray:
    """``ids`` as a 1-D int64 array (of ``count`` entries when given)."""
    if isinstance(ids, torch.Tensor):
        ids = ids.detach().cpu().numpy()
    ids = np.asarray(ids)
    if ids.ndim != 1 or (count is not None and ids.shape[0] != count):
        expected = f"({count},)" if count is not None else "1-D"
        raise ValueError(f"{name} must have shape {expected}, got {ids.shape}")
    if ids.size and not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"{name} must be integers, got dtype {ids.dtype}")
    return ids.astype(np.int64)


def _like(array: np.ndarray, reference: Any) -> Any:
    """``array`` as a torch tensor on ``reference``'s device when ``reference`` is a tensor, else as is."""
    if isinstance(reference, torch.Tensor):
        return torch.from_numpy(np.ascontiguousarray(array)).to(reference.device)
    return array


class TrainingSizeWarning(UserWarning):
    """:meth:`VectorIndex.train` was given fewer rows than the index's ``recommended_training_rows``."""


class VectorIndex(abc.ABC):
    """Abstract maximum-inner-product index (see the module docstring for the contract).

    Subclasses implement ``_add``, ``_search`` (on positions), ``_remove_positions``, ``_reconstruct``,
    ``_reset`` and the persistence hooks; this class handles validation, labels and array types.
    """

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
        self._labels: np.ndarray | None = None  # position -> label, once add_with_ids / remove_ids is used

    # ---------------------------------------------------------------- properties
    @property
    def d(self) -> int:
        """The vector dimension (faiss's name)."""
        return self.dim

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
    def recommended_training_rows(self) -> int:
        """The fewest rows :meth:`train` learns from as designed (1 for data-oblivious methods); fewer still
        train, with a :class:`TrainingSizeWarning`."""
        return 1

    @property
    def bits_per_coordinate(self) -> float:
        """Storage actually spent per database coordinate, ``8·nbytes / (ntotal·dim)``."""
        if self.ntotal == 0:
            raise ValueError("bits_per_coordinate is undefined for an empty index")
        return 8.0 * self.nbytes / (self.ntotal * self.dim)

    @property
    def labels(self) -> np.ndarray:
        """(ntotal,) int64: the label of each stored row, in storage order."""
        return np.arange(self.ntotal, dtype=np.int64) if self._labels is None else self._labels

    # ---------------------------------------------------------------- operations
    def train(self, x: Any) -> None:
        """Learn from ``x`` (n, dim). Data-oblivious methods only validate the input. Fewer rows than
        ``recommended_training_rows`` train with a :class:`TrainingSizeWarning`."""
        x = as_float_matrix(x, self.dim, "training data")
        if len(x) < self.recommended_training_rows:
            warnings.warn(f"{self.name}: training on {len(x)} rows, fewer than the {self.recommended_training_rows} "
                          "it is designed for", TrainingSizeWarning, stacklevel=2)
        self._train(x)
        self.is_trained = True

    def _train(self, x: np.ndarray) -> None:  # noqa: B027 - optional hook, data-oblivious by default
        """Method-specific training; the default learns nothing."""

    def add(self, x: Any) -> None:
        """Encode the rows of ``x`` (n, dim) and append them, labelled ``ntotal, ntotal + 1, …``."""
        x = self._checked_rows(x)
        if self._labels is None:
            self._add(x)
        else:
            self._add_labelled(x, self.ntotal + np.arange(x.shape[0], dtype=np.int64))

    def add_with_ids(self, x: Any, ids: Any) -> None:
        """Encode the rows of ``x`` and append them labelled by ``ids`` (n,) int64, distinct from every label
        already stored."""
        x = self._checked_rows(x)
        self._add_labelled(x, _check_ids(ids, x.shape[0], "ids"))

    def _add_labelled(self, x: torch.Tensor, ids: np.ndarray) -> None:
        labels = np.concatenate([self.labels, ids])
        if len(np.unique(labels)) != len(labels):
            raise ValueError("labels must be distinct: the ids given repeat, or are already in the index")
        self._add(x)
        self._labels = labels

    def _checked_rows(self, x: Any) -> torch.Tensor:
        if not self.is_trained:
            raise ValueError(f"{type(self).__name__} must be trained (train(x)) before add()")
        return as_float_tensor(x, self.dim, "database vectors")

    def search(self, x: Any, k: int) -> tuple[Any, Any]:
        """``D, I``: the top-``k`` scores (m, k) float32 and labels (m, k) int64 of each query row, best first.

        NumPy in, NumPy out; a torch tensor in, torch tensors out on its device."""
        k = check_k(k, self.ntotal)
        queries = as_float_tensor(x, self.dim, "queries")
        scores, positions = self._search(queries, k)
        scores = np.ascontiguousarray(scores, dtype=np.float32)
        ids = self.labels[np.asarray(positions, dtype=np.int64)]
        return _like(scores, x), _like(ids, x)

    def range_search(self, x: Any, radius: float) -> tuple[Any, Any, Any]:
        """``lims, D, I``: every row with an estimated inner product above ``radius``, per query, best first
        (query i's hits are ``D[lims[i]:lims[i+1]]``, as in faiss). Scans the whole database per query."""
        if self.ntotal == 0:
            raise ValueError("the index is empty: add() vectors before range_search()")
        queries = as_float_tensor(x, self.dim, "queries")
        scores, positions = self._search(queries, self.ntotal)
        scores = np.asarray(scores, dtype=np.float32)
        keep = scores > float(radius)
        lims = np.concatenate([[0], np.cumsum(keep.sum(axis=1))]).astype(np.int64)
        ids = self.labels[np.asarray(positions, dtype=np.int64)[keep]]
        return _like(lims, x), _like(scores[keep], x), _like(ids, x)

    def remove_ids(self, ids: Any) -> int:
        """Remove the rows labelled by any of ``ids``; return how many were removed."""
        ids = _check_ids(ids, None, "ids")
        positions = np.flatnonzero(np.isin(self.labels, ids))
        if len(positions):
            labels = np.delete(self.labels, positions)
            self._remove_positions(positions)
            self._labels = labels
        return int(len(positions))

    def reconstruct(self, key: int) -> np.ndarray:
        """(dim,) float32: the index's reconstruction of the row labelled ``key``."""
        matches = np.flatnonzero(self.labels == int(key))
        if not len(matches):
            raise KeyError(f"no row labelled {key} in the index")
        return np.asarray(self._reconstruct(int(matches[0])), dtype=np.float32)

    def reset(self) -> None:
        """Remove every row (training is kept)."""
        self._reset()
        self._labels = None

    @abc.abstractmethod
    def _add(self, x: torch.Tensor) -> None:
        """Encode validated float32 rows."""

    @abc.abstractmethod
    def _search(self, queries: torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Scores and storage positions of the top ``k`` for validated float32 queries."""

    @abc.abstractmethod
    def _remove_positions(self, positions: np.ndarray) -> None:
        """Drop the rows at sorted storage ``positions``; later rows move up, order kept."""

    @abc.abstractmethod
    def _reconstruct(self, position: int) -> np.ndarray:
        """The reconstruction of the row at storage ``position``."""

    @abc.abstractmethod
    def _reset(self) -> None:
        """Drop every row."""

    # ---------------------------------------------------------------- persistence
    @abc.abstractmethod
    def config(self) -> dict[str, Any]:
        """JSON-serialisable constructor arguments (``type(self)(**config())`` rebuilds an empty index)."""

    @abc.abstractmethod
    def state_arrays(self) -> dict[str, np.ndarray]:
        """Arrays that, together with :meth:`config`, restore the index exactly."""

    @classmethod
    @abc.abstractmethod
    def check_saved(cls, config: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        """ValueError unless ``arrays`` are what an index built from ``config`` saves (checked before the
        index is constructed from a file)."""

    @abc.abstractmethod
    def load_state_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        """Inverse of :meth:`state_arrays` on an index freshly built from the same config."""

    def save(self, path: str | Path) -> Path:
        """Write the index to one ``.npz`` file; returns the path (format: :mod:`turboquant.ann.index_file`)."""
        from turboquant.ann.index_file import write_index_file

        arrays = self.state_arrays()
        if self._labels is not None:
            arrays["labels"] = self._labels
        meta = {"method": self.method, "config": self.config(), "is_trained": self.is_trained}
        return write_index_file(path, meta, arrays)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(dim={self.dim}, bits={self.bits}, ntotal={self.ntotal})"
