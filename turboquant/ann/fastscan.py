"""TurboQuant codes scanned by faiss's SIMD fast-scan engine: candidate generation for exact re-ranking.

After the rotation, TurboQuant_mse is a product quantizer with one coordinate per sub-quantizer and one
fixed, data-independent codebook c (Lloyd-Max, Eq. 4): the unit-norm score of a stored vector is

    s(x) = Σ_j t_j · c[idx_j],    t = Π q   (the rotated query, computed once per query).

faiss's ``IndexPQFastScan`` scans 4-bit sub-quantizer codes with 16-entry lookup tables held in SIMD
registers (André et al., "Quicker ADC"), quantized to 8 bits and accumulated in 16 bits. So TurboQuant's
codes are handed to it as a PQ whose sub-quantizer m covers g = 4 / b coordinates j ∈ [g·m, g·m + g) and
whose 16 centroids are the Cartesian product of the codebook over those coordinates: the packed b-bit
code stream (``turboquant.pack_codes``: code j at stream bits [j·b, (j+1)·b)) *is* then faiss's 4-bit code
stream, byte for byte, and faiss's table for sub-quantizer m and nibble v is Σ_i t_{g·m+i} c[code_i(v)].

TurboQuant_prod (Algorithm 2) adds a QJL stage, w(x) · Σ_j u_j · z_j with u = S q, z = sign(S r) and the
per-vector weight w(x) = √(π/2)/d · ‖r‖. A per-vector weight cannot ride in an additive table, so the
candidate score uses its expectation, w̄ = √(π/2)/d · √(D_mse(b−1)) (‖r‖² concentrates at the MSE stage's
distortion, Theorem 1): each sub-quantizer then covers g coordinates of both stages (g·(b−1) MSE bits and
g sign bits, g = 4 / b), its sub-vector is (t_{g·m..}, u_{g·m..}) and its centroids (c[·], ±w̄).

The 16-bit accumulator. faiss rounds each query's float tables T[m, v] to 8 bits with one scale for
all sub-quantizers, q[m, v] = ⌊a·(T[m, v] − min_v T[m, ·]) + ½⌋ with a = 255 / max_m span_m
(span_m = max_v T[m, ·] − min_v T[m, ·]), and sums the M entries of a row in 16-bit integers, modulo
2¹⁶ (faiss/utils/quantize_lut.cpp, round_uint8_per_column). A row's sum is at most a·Σ_m span_m + M/2,
which exceeds 65,535 once M is a few hundred: at M = 1536 a row scoring far above the rest (a
384-d subspace lifted to 1536-d) wraps around to a low score and is never re-ranked. The layout adds
one *guard* sub-quantizer, code v₀ (its smallest table entry, so it adds 0 to every sum) in every row,
whose query sub-vector is scaled per query so that its span is G = 255·Σ_m span_m / (65,535 − M) when
that exceeds max_m span_m (zero otherwise). Then a = 255 / G, every sum stays below 2¹⁶, and no score
wraps; the price is coarser tables (about 175 levels instead of 255 at d = 1536, 4 bits, for Gaussian
rotated queries). faiss's scores carry the guard's constant min_v T_guard[v], subtracted in
:meth:`FastScanCodes.search`.

The scores found this way differ from the exact estimator by the table quantization, by w̄ in
place of w(x) and by the vector norm ‖x‖ (every candidate score is a unit-norm score); callers re-rank
the top candidates with the exact scorer (``TurboQuantIndex``), so these errors only decide which rows
are re-ranked. Bit widths b with 4 mod b ≠ 0 (3, 5-8 bits) have no 4-bit sub-quantizer layout.

Single queries: faiss scans one query on one thread, so the rows are dealt round-robin to ``shards``
fast-scan indexes (row i to shard i mod shards) that are scanned in parallel threads once there are
8 MiB of codes or more; a batch of queries is scanned shard after shard, faiss splitting the queries
over its OpenMP threads (each shard call builds the batch's lookup tables again). The same threads
(:meth:`FastScanCodes.map`) serve the caller's re-rank of a batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import faiss
import numpy as np
import torch

import turboquant as tq

__all__ = ["FastScanCodes", "FastScanLayout", "FastScanStage"]

T, R = TypeVar("T"), TypeVar("R")
_CODE_BITS = 4  # faiss fast-scan sub-quantizer codes
_BLOCK = 32  # faiss fast-scan block size (bbs): vectors whose codes are interleaved for one SIMD scan
#: the largest 16-bit accumulator sum the guard allows: 2¹⁶ − 1 less a float32-rounding allowance
_ACCUMULATOR_MAX = 65535 * (1 - 1e-4)
#: codes below which a single query's shards are scanned on the calling thread: handing a short scan to another
#: thread costs more than it saves (benchmarks/NOTES.md, "Constants")
_PARALLEL_MIN_BYTES = 1 << 23


@dataclass(frozen=True)
class FastScanStage:
    """One additive stage of the candidate score: ``bits``-bit codes naming ``centroids``, times ``weight``."""

    centroids: np.ndarray  # (2**bits,)
    bits: int
    weight: float


class FastScanLayout:
    """How the stages' codes and transformed queries map onto faiss 4-bit sub-quantizers.

    Args:
        stages: the score's stages, in order (MSE stage first); their bits must sum to a divisor of 4.
        dim: coordinates per stage (d).
    """

    def __init__(self, stages: Sequence[FastScanStage], dim: int) -> None:
        total = sum(stage.bits for stage in stages)
        if _CODE_BITS % total:
            raise ValueError(f"fast-scan needs bits per coordinate dividing {_CODE_BITS}, got {total}")
        self.stages, self.dim = tuple(stages), dim
        self.group = _CODE_BITS // total  # coordinates per sub-quantizer
        self.n_sub = -(-dim // self.group)  # faiss M
        self.sub_dim = self.group * len(stages)  # faiss dsub
        values = np.arange(1 << _CODE_BITS)
        columns, offset = [], 0
        for stage in self.stages:
            centroids = np.asarray(stage.centroids, dtype=np.float64) * stage.weight
            for i in range(self.group):
                columns.append(centroids[(values >> (offset + i * stage.bits)) & ((1 << stage.bits) - 1)])
            offset += self.group * stage.bits
        #: (16, sub_dim) float32: the centroid of nibble v, the same for every sub-quantizer
        self.centroids = np.stack(columns, axis=1).astype(np.float32)
        # each column takes its values on its own bit field and the 16 nibbles run over every combination of
        # fields, so a table's span is Σ_i |query_i| · ptp(column i) (no (m, M, 16) tables are formed per query)
        self._column_spans = np.ptp(self.centroids.astype(np.float64), axis=0).astype(np.float32)
        # the guard sub-quantizer (module docstring): direction (1, …, 1), whose smallest entry v₀ every row holds
        guard_values = self.centroids.astype(np.float64).sum(axis=1)
        self._guard_code = int(np.argmin(guard_values))
        self._guard_min, self._guard_span = float(guard_values.min()), float(np.ptp(guard_values))
        if self._guard_span <= 0:
            raise ValueError("fast-scan centroids must not be all equal")

    @property
    def faiss_sub(self) -> int:
        """faiss's M: the ``n_sub`` sub-quantizers of the codes plus the guard."""
        return self.n_sub + 1

    @property
    def faiss_dim(self) -> int:
        return self.faiss_sub * self.sub_dim

    @property
    def code_size(self) -> int:
        """Bytes of one row's faiss code (two 4-bit codes a byte, the guard's last)."""
        return -(-self.faiss_sub * _CODE_BITS // 8)

    def queries(self, transformed: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """(m, faiss_dim) float32 faiss queries and the (m,) constant the guard adds to their scores.

        Sub-vector m < n_sub holds coordinates g·m … g·m+g−1 of each stage's T_s q; the last is the guard's,
        scaled so that no row's 16-bit sum can exceed 2¹⁶ − 1 (module docstring)."""
        m, padded = transformed[0].shape[0], self.n_sub * self.group
        parts = [np.pad(t, ((0, 0), (0, padded - self.dim))).reshape(m, self.n_sub, self.group) for t in transformed]
        sub = np.concatenate(parts, axis=2).astype(np.float32, copy=False)  # (m, n_sub, sub_dim)
        spans = (np.abs(sub) @ self._column_spans).astype(np.float64)  # (m, n_sub): spans of faiss's float tables
        needed = 255 * spans.sum(axis=1) / (_ACCUMULATOR_MAX - self.n_sub)
        guard_span = np.where(needed > spans.max(axis=1), needed, 0.0)
        scale = guard_span / self._guard_span
        guard = np.broadcast_to(scale[:, None, None], (m, 1, self.sub_dim)).astype(np.float32)
        queries = np.ascontiguousarray(np.concatenate([sub, guard], axis=1).reshape(m, self.faiss_dim))
        return queries, (scale * self._guard_min).astype(np.float32)

    def codes(self, packed: Sequence[np.ndarray]) -> np.ndarray:
        """(n, code_size) uint8 faiss codes from each stage's packed rows (``turboquant.pack_codes`` layout).

        One stage: the packed stream already is the 4-bit code stream. Several: the nibble of sub-quantizer m
        holds each stage's g codes, stage after stage. The guard's code v₀ follows as nibble n_sub."""
        n = packed[0].shape[0]
        if len(self.stages) == 1:
            stream = np.ascontiguousarray(packed[0])
        else:
            padded = self.n_sub * self.group
            nibbles = torch.zeros((n, self.n_sub), dtype=torch.uint8)
            offset = 0
            for stage, rows in zip(self.stages, packed):
                codes = tq.unpack_codes(torch.from_numpy(np.ascontiguousarray(rows)), stage.bits, self.dim)
                codes = torch.nn.functional.pad(codes.to(torch.uint8), (0, padded - self.dim))
                codes = codes.reshape(-1, self.n_sub, self.group)
                for i in range(self.group):
                    nibbles |= codes[:, :, i] << (offset + i * stage.bits)
                offset += self.group * stage.bits
            stream = tq.pack_codes(nibbles, _CODE_BITS).numpy()
        out = np.zeros((n, self.code_size), np.uint8)
        out[:, : stream.shape[1]] = stream
        out[:, self.n_sub // 2] |= np.uint8(self._guard_code << (_CODE_BITS * (self.n_sub % 2)))
        return out

    def index(self, codes: np.ndarray) -> faiss.IndexPQFastScan:
        """A faiss fast-scan index holding ``codes`` (n, code_size) in its blocked SIMD layout."""
        flat = faiss.IndexPQ(self.faiss_dim, self.faiss_sub, _CODE_BITS, faiss.METRIC_INNER_PRODUCT)
        faiss.copy_array_to_vector(np.broadcast_to(self.centroids, (self.faiss_sub, 16, self.sub_dim)).ravel(),
                                   flat.pq.centroids)
        flat.is_trained = True
        faiss.copy_array_to_vector(np.ascontiguousarray(codes).ravel(), flat.codes)
        flat.ntotal = codes.shape[0]
        return faiss.IndexPQFastScan(flat, _BLOCK)


class FastScanCodes:
    """TurboQuant codes in faiss fast-scan layout, dealt round-robin to ``shards`` indexes.

    Row i (insertion order) lives in shard i mod ``shards`` at local position i // ``shards``.
    """

    def __init__(self, layout: FastScanLayout, shards: int) -> None:
        if shards < 1:
            raise ValueError(f"shards must be positive, got {shards}")
        self.layout = layout
        self._shards = [layout.index(np.zeros((0, layout.code_size), np.uint8)) for _ in range(shards)]
        # with a single query: shard 0 is scanned by the calling thread, the others by this pool
        self._pool = ThreadPoolExecutor(shards - 1) if shards > 1 else None

    @property
    def ntotal(self) -> int:
        return sum(int(shard.ntotal) for shard in self._shards)

    @property
    def threads(self) -> int:
        """Threads :meth:`map` runs on (the calling thread and the pool): one per shard."""
        return len(self._shards)

    def map(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
        """``[fn(item) for item in items]``, the first on the calling thread and the others on the pool (at most
        ``threads`` at a time); for work that releases the GIL (faiss searches, NumPy gathers and products)."""
        if self._pool is None or len(items) < 2:
            return [fn(item) for item in items]
        others = [self._pool.submit(fn, item) for item in items[1:]]
        return [fn(items[0]), *(future.result() for future in others)]

    def add(self, packed: Sequence[np.ndarray]) -> None:
        """Append rows given as each stage's packed codes (converted to the blocked layout here, once)."""
        codes, start, count = self.layout.codes(packed), self.ntotal, len(self._shards)
        for s, shard in enumerate(self._shards):
            part = codes[(s - start) % count :: count]
            if len(part):
                shard.merge_from(self.layout.index(part))

    def search(self, transformed: Sequence[np.ndarray], k: int) -> tuple[np.ndarray, np.ndarray]:
        """(m, k') candidate scores and global row ids, best first, k' = min(k, ntotal)."""
        queries, guard = self.layout.queries(transformed)
        k = min(k, self.ntotal)
        shards = [(s, shard) for s, shard in enumerate(self._shards) if shard.ntotal]

        def scan(item: tuple[int, faiss.Index]) -> tuple[np.ndarray, np.ndarray]:
            s, shard = item
            scores, ids = shard.search(queries, min(k, int(shard.ntotal)))
            return scores, ids * len(self._shards) + s

        # a query per shard thread: faiss scanned one query on one thread where this was tuned, and splits a batch
        # over its own threads (benchmarks/NOTES.md, issue 17: not so on every CPU)
        parallel = queries.shape[0] < len(shards) and self.ntotal * self.layout.code_size >= _PARALLEL_MIN_BYTES
        results = self.map(scan, shards) if parallel else [scan(item) for item in shards]
        scores = np.concatenate([r[0] for r in results], axis=1)
        ids = np.concatenate([r[1] for r in results], axis=1)
        if len(results) > 1:
            order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
            scores, ids = np.take_along_axis(scores, order, 1), np.take_along_axis(ids, order, 1)
        return scores - guard[:, None], ids
