"""The paper's nearest-neighbour baselines, as faiss indexes behind :class:`~turboquant.ann.base.VectorIndex`.

* ``exact``        ``faiss.IndexFlatIP``: brute-force inner products, the ground truth.
* ``pq``           ``faiss.IndexPQ`` with 8-bit sub-quantizers (256 k-means codewords each), i.e. the paper's
                   "LUT256" product quantization: a sub-vector of ``8 / bits`` coordinates per byte
                   (4 coordinates at 2 bits, 2 at 4 bits), codebooks trained on the base set (arXiv v1 §4.4).
* ``pq_fastscan``  ``faiss.IndexPQFastScan``: 4-bit sub-quantizers (16 codewords, ``4 / bits`` coordinates
                   each) scanned with SIMD in-register lookup tables; same bits per coordinate as ``pq``,
                   a different speed/accuracy trade-off. Used for the search-speed comparison.
* ``rabitq``       ``faiss.IndexRaBitQ`` (Gao & Long 2024) with ``nb_bits = bits``: 1 bit is plain RaBitQ,
                   more bits are *extended* RaBitQ (1 sign bit + ``bits - 1`` refinement bits per coordinate)
                   plus per-vector correction factors. Queries are kept in float (``qb = 0``) so that every
                   method sees unquantized queries.

faiss is an optional dependency (``turboquant-repro[experiments]``); it is imported when this module is.
Sub-quantizers need ``dim`` divisible by the sub-vector length; otherwise the vectors are padded with zero
coordinates (inner products are unchanged) and the padding is counted in ``nbytes``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import faiss
import numpy as np
import torch

from turboquant.ann.base import VectorIndex

__all__ = ["ExactIndex", "PQIndex", "PQFastScanIndex", "RaBitQIndex", "FaissIndex"]


class FaissIndex(VectorIndex):
    """Shared plumbing: zero padding of the inputs, delegation to a faiss index, (de)serialisation."""

    def __init__(self, dim: int, bits: int | None) -> None:
        super().__init__(dim, bits)
        self.padded_dim = _round_up(self.dim, self.sub_vector_length)
        self._index = self._make_faiss_index()
        self._apply_settings()

    @property
    def sub_vector_length(self) -> int:
        """Coordinates per sub-quantizer code (1 for indexes without sub-quantizers)."""
        return 1

    def _make_faiss_index(self) -> faiss.Index:
        raise NotImplementedError

    def _pad(self, x: np.ndarray) -> np.ndarray:
        if self.padded_dim == self.dim:
            return x
        return np.ascontiguousarray(np.pad(x, ((0, 0), (0, self.padded_dim - self.dim))))

    @property
    def faiss_index(self) -> faiss.Index:
        """The wrapped faiss index (for faiss-specific inspection, e.g. search parameters)."""
        return self._index

    @property
    def ntotal(self) -> int:
        return int(self._index.ntotal)

    @property
    def nbytes(self) -> int:
        return int(self._index.sa_code_size()) * self.ntotal

    def _train(self, x: np.ndarray) -> None:
        self._index.train(self._pad(x))

    def _add(self, x: torch.Tensor) -> None:
        self._index.add(self._pad(x.cpu().numpy()))

    def _search(self, queries: torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray]:
        scores, ids = self._index.search(self._pad(queries.cpu().numpy()), k)
        return scores, ids

    def _remove_positions(self, positions: np.ndarray) -> None:
        # faiss labels rows by position here (never add_with_ids) and compacts in order on removal
        self._index.remove_ids(faiss.IDSelectorArray(positions.astype(np.int64)))

    def _reconstruct(self, position: int) -> np.ndarray:
        return self._index.reconstruct(position)[: self.dim]

    def _reset(self) -> None:
        self._index.reset()

    def config(self) -> dict[str, Any]:
        return {"dim": self.dim, "bits": self.bits}

    def state_arrays(self) -> dict[str, np.ndarray]:
        return {"faiss_index": faiss.serialize_index(self._index)}

    @classmethod
    def check_saved(cls, config: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        if set(arrays) != {"faiss_index"}:
            raise ValueError(f"a faiss-backed index saves one array 'faiss_index', found {sorted(arrays)}")
        if arrays["faiss_index"].dtype != np.uint8 or arrays["faiss_index"].ndim != 1:
            raise ValueError("'faiss_index' must be a 1-D uint8 byte string")

    def load_state_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        self.check_saved(self.config(), arrays)
        try:
            index = faiss.deserialize_index(np.ascontiguousarray(arrays["faiss_index"]))
        except RuntimeError as error:
            raise ValueError(f"faiss cannot read the saved index: {str(error).splitlines()[0]}") from None
        if index.d != self.padded_dim:
            raise ValueError(f"saved faiss index has d={index.d}, expected {self.padded_dim}")
        self._index = index
        self._apply_settings()

    def _apply_settings(self) -> None:
        """Set on ``self._index`` what faiss does not serialise (nothing by default); after construction and after
        loading."""


def _sub_vector_length(bits: int | None, code_bits: int, method: str) -> int:
    """Coordinates per sub-quantizer when each ``code_bits``-bit code spends ``bits`` bits per coordinate."""
    if bits is None or code_bits % bits:
        raise ValueError(
            f"{method} needs bits per coordinate dividing {code_bits} (sub-vectors of {code_bits}/bits "
            f"coordinates per {code_bits}-bit code); got bits={bits}"
        )
    return code_bits // bits


#: faiss's k-means asks for this many training points per centroid (``ClusteringParameters.min_points_per_centroid``)
_KMEANS_MIN_POINTS = int(faiss.ClusteringParameters().min_points_per_centroid)


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


class ExactIndex(FaissIndex):
    """Brute-force float32 inner products (``faiss.IndexFlatIP``): the ground truth, 32 bits/coordinate."""

    method: ClassVar[str] = "exact"

    def __init__(self, dim: int, bits: int | None = None) -> None:
        if bits not in (None, 32):
            raise ValueError(f"exact search stores float32 vectors; bits must be None or 32, got {bits}")
        super().__init__(dim, None)

    def _make_faiss_index(self) -> faiss.Index:
        return faiss.IndexFlatIP(self.dim)


class PQIndex(FaissIndex):
    """Product quantization with 256-codeword (8-bit) sub-quantizers: the paper's LUT256 baseline.

    ``M = padded_dim · bits / 8`` sub-quantizers, each a k-means codebook of 256 centroids over a sub-vector
    of ``8 / bits`` coordinates, trained by faiss's k-means (25 iterations, at most 256 points per centroid
    sampled from the training set). Search uses asymmetric distance computation: one 256-entry table of
    ⟨q_sub, centroid⟩ per sub-quantizer and query, then a table lookup and sum per database code.
    """

    method: ClassVar[str] = "pq"
    requires_training: ClassVar[bool] = True
    sub_bits: ClassVar[int] = 8            # bits of one sub-quantizer code
    faiss_class: ClassVar[str] = "IndexPQ"

    @property
    def sub_vector_length(self) -> int:
        return _sub_vector_length(self.bits, self.sub_bits,
                                  f"{self.faiss_class} with {self.sub_bits}-bit sub-quantizers")

    def _make_faiss_index(self) -> faiss.Index:
        m = self.padded_dim // self.sub_vector_length
        return getattr(faiss, self.faiss_class)(self.padded_dim, m, self.sub_bits, faiss.METRIC_INNER_PRODUCT)

    @property
    def model_nbytes(self) -> int:
        return 4 * int(self._index.pq.centroids.size())

    @property
    def recommended_training_rows(self) -> int:
        """faiss's k-means minimum, ``min_points_per_centroid`` rows per codeword of a sub-quantizer."""
        return _KMEANS_MIN_POINTS * int(self._index.pq.ksub)

    def _apply_settings(self) -> None:
        # Below the minimum faiss prints a line per sub-quantizer (d / 2 lines at 4 bits); train() warns once instead.
        self._index.pq.cp.min_points_per_centroid = 0


class PQFastScanIndex(PQIndex):
    """Product quantization with 4-bit sub-quantizers scanned by faiss's SIMD fast-scan kernels.

    ``M = padded_dim · bits / 4`` sub-quantizers of 16 codewords over ``4 / bits`` coordinates each; the
    per-query lookup tables are quantized to 8 bits and kept in SIMD registers (André et al., "Quicker ADC").
    """

    method: ClassVar[str] = "pq_fastscan"
    sub_bits: ClassVar[int] = 4
    faiss_class: ClassVar[str] = "IndexPQFastScan"


class RaBitQIndex(FaissIndex):
    """RaBitQ (``bits = 1``) and extended RaBitQ (``bits > 1``) via ``faiss.IndexRaBitQ(d, IP, nb_bits)``.

    Training computes the data centroid; each vector stores its ``bits``-bit-per-coordinate code of the
    (randomly rotated, centred) direction plus float correction factors, all counted in ``nbytes``.
    ``query_bits`` is faiss's ``qb`` (0 = float queries, the default here; RaBitQ's own default is 4).
    """

    method: ClassVar[str] = "rabitq"
    requires_training: ClassVar[bool] = True

    def __init__(self, dim: int, bits: int, query_bits: int = 0) -> None:
        if not 0 <= query_bits <= 8:
            raise ValueError(f"query_bits must be in 0..8 (0 = float queries), got {query_bits}")
        if isinstance(bits, int) and bits > 9:
            raise ValueError(f"faiss IndexRaBitQ supports 1..9 bits per coordinate, got {bits}")
        self.query_bits = int(query_bits)
        super().__init__(dim, bits)

    def _make_faiss_index(self) -> faiss.Index:
        return faiss.IndexRaBitQ(self.dim, faiss.METRIC_INNER_PRODUCT, self.bits)

    def _apply_settings(self) -> None:
        self._index.qb = self.query_bits

    @property
    def model_nbytes(self) -> int:
        return 4 * self.dim  # the centroid

    def config(self) -> dict[str, Any]:
        return {**super().config(), "query_bits": self.query_bits}
