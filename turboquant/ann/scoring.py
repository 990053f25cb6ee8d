"""Inner products between rotated queries and packed scalar codes, without decoding the whole database.

TurboQuant_mse stores, per database vector x, its norm and the codes ``idx_j`` of the rotated unit
vector Π x/‖x‖ (Algorithm 1). Since x̃ = ‖x‖ Πᵀ c[idx], an inner product needs only the *rotated query*
t = Π q, computed once per query:

    ⟨q, x̃⟩ = ‖x‖ · Σ_j t_j · c[idx_j].                                                    (★)

Codes are packed as a little-endian bit stream (``turboquant.pack_codes``). When the bit width b divides
8, byte p of a code row holds exactly the g = 8/b codes of coordinates g·p … g·p+g-1, so a *byte* can be
decoded or scored as one unit. Two equivalent evaluations of (★) over a chunk of database rows:

* :func:`dense_scores` — decode the chunk to float through a 256-row table (byte → g centroid values),
  then one matrix product with all queries. Cost per chunk: n·d decoded floats + a GEMM.
* :func:`lut_scores` — per query, a lookup table T[p, v] = Σ_{i<g} t_{g·p+i} · c[code_i(v)] over the 256
  byte values of each byte position p (ADC, as in product quantization); a row's score is the sum of
  d/g table entries gathered by its bytes. Cost per query and row: d/g gathers, no float decode.

Both return unit-norm scores Σ_j t_j c[idx_j]; callers multiply by ‖x‖. Widths that do not divide 8
(3, 5, 6, 7 bits) are unpacked group by group (8 codes fill b bytes: one word, split by shifts) on the
dense path and for re-ranking.
The same functions score TurboQuant_prod's 1-bit QJL signs with the two-entry codebook (-1, +1).
"""

from __future__ import annotations

import numpy as np
import torch

from ..packing import packed_size

__all__ = ["CodeDecoder", "candidate_scores", "dense_scores", "lut_scores", "lut_tables", "merge_top_k"]

_CANDIDATE_FLOATS = 1 << 22  # decoded floats per re-ranking step (16 MiB)


class CodeDecoder:
    """Decodes packed b-bit code rows of a ``dim``-coordinate vector to the centroid values they name."""

    def __init__(self, centroids: np.ndarray | torch.Tensor, bits: int, dim: int) -> None:
        centroids = np.asarray(centroids, dtype=np.float32)
        if centroids.ndim != 1 or centroids.size != 2**bits:
            raise ValueError(f"need 2**bits = {2**bits} centroids, got shape {centroids.shape}")
        self.bits, self.dim, self.centroids = bits, dim, centroids
        self.byte_aligned = 8 % bits == 0
        self.codes_per_byte = 8 // bits if self.byte_aligned else 0
        self.bytes_per_row = packed_size(dim, bits)
        if self.byte_aligned:
            shifts = bits * np.arange(self.codes_per_byte)
            codes = (np.arange(256)[:, None] >> shifts[None, :]) & (2**bits - 1)  # (256, g)
            #: (256, g) float32: byte_table[v, i] = centroid of the i-th code packed in byte value v
            self.byte_table = np.ascontiguousarray(centroids[codes])

    @property
    def padded_dim(self) -> int:
        """Coordinates covered by a packed row (``dim`` rounded up to whole bytes when byte-aligned)."""
        return self.bytes_per_row * self.codes_per_byte if self.byte_aligned else self.dim

    def decode(self, packed: np.ndarray) -> np.ndarray:
        """(n, bytes_per_row) uint8 -> (n, padded_dim) float32 centroid values.

        ``np.take`` with the uint8 codes as indices (torch advanced indexing first widens them to int64;
        benchmarks/NOTES.md, "Constants").
        """
        if self.byte_aligned:
            return np.take(self.byte_table, packed, axis=0).reshape(packed.shape[0], self.padded_dim)
        return np.take(self.centroids, self._unpack(packed))

    def _unpack(self, packed: np.ndarray) -> np.ndarray:
        """(n, bytes_per_row) -> (n, dim) uint8 codes of a width not dividing 8 (``turboquant.pack_codes``
        layout: every 8 codes fill b bytes, read here as one little-endian word and split by shifts)."""
        n, b = packed.shape[0], self.bits
        groups = -(-self.dim // 8)
        whole = np.zeros((n, groups * b), np.uint8)
        whole[:, : packed.shape[1]] = packed
        word_type = np.uint32 if 8 * b <= 32 else np.uint64
        grouped = whole.reshape(n, groups, b)
        word = np.zeros((n, groups), word_type)
        for i in range(b):
            word |= grouped[:, :, i].astype(word_type) << word_type(8 * i)
        codes = np.empty((n, groups, 8), np.uint8)
        mask = word_type((1 << b) - 1)
        for j in range(8):
            codes[:, :, j] = (word >> word_type(b * j)) & mask
        return codes.reshape(n, groups * 8)[:, : self.dim]

    def pad_queries(self, rotated_queries: np.ndarray) -> np.ndarray:
        """Zero-pad query coordinates to ``padded_dim`` so padding codes contribute nothing."""
        extra = self.padded_dim - rotated_queries.shape[-1]
        return np.pad(rotated_queries, ((0, 0), (0, extra))) if extra else rotated_queries


def dense_scores(rotated_queries: np.ndarray, packed: np.ndarray, decoder: CodeDecoder) -> torch.Tensor:
    """(m, dim) rotated queries · decoded (n, ·) codes -> (m, n) unit-norm scores Σ_j t_j c[idx_j]."""
    queries = torch.from_numpy(np.ascontiguousarray(decoder.pad_queries(rotated_queries), dtype=np.float32))
    return queries @ torch.from_numpy(decoder.decode(packed)).T


def candidate_scores(
    rotated_queries: np.ndarray, packed: np.ndarray, candidates: np.ndarray, decoder: CodeDecoder
) -> np.ndarray:
    """(m, c) unit-norm scores Σ_j t_ij c[idx_j] of query i against the rows ``candidates[i]`` (m, c) of
    ``packed`` (n, ·): the candidates' codes are gathered and decoded, a few queries at a time."""
    queries = decoder.pad_queries(rotated_queries).astype(np.float32, copy=False)
    m, c = candidates.shape
    out = np.empty((m, c), np.float32)
    step = max(1, _CANDIDATE_FLOATS // max(1, c * decoder.padded_dim))
    for first in range(0, m, step):
        rows = candidates[first : first + step]
        decoded = decoder.decode(packed[rows.ravel()]).reshape(rows.shape[0], c, decoder.padded_dim)
        out[first : first + step] = np.matmul(decoded, queries[first : first + step, :, None])[:, :, 0]
    return out


def lut_tables(rotated_queries: np.ndarray, decoder: CodeDecoder) -> np.ndarray:
    """Per-query ADC tables, laid out (P, 256, m): T[p, v, q] = Σ_i t[q, g·p+i] · c[code_i(v)]."""
    if not decoder.byte_aligned:
        raise ValueError(f"lookup-table scoring needs a bit width dividing 8, got {decoder.bits}")
    m = rotated_queries.shape[0]
    t = decoder.pad_queries(rotated_queries).reshape(m, decoder.bytes_per_row, decoder.codes_per_byte)
    return np.ascontiguousarray(np.einsum("mpi,vi->pvm", t, decoder.byte_table, optimize=True), dtype=np.float32)


def lut_scores(tables: np.ndarray, packed: np.ndarray) -> torch.Tensor:
    """(P, 256, m) tables, (n, P) uint8 codes -> (m, n) scores Σ_p T[p, packed[row, p], q].

    One gather of n table rows per byte position p (codes transposed once so each gather reads a
    contiguous column); the m queries ride along in the innermost axis.
    """
    columns = np.ascontiguousarray(packed.T)  # (P, n)
    total = np.zeros((packed.shape[0], tables.shape[2]), dtype=np.float32)
    for table, column in zip(tables, columns):
        total += np.take(table, column, axis=0)
    return torch.from_numpy(np.ascontiguousarray(total.T))


def merge_top_k(
    best_scores: torch.Tensor | None,
    best_ids: torch.Tensor | None,
    chunk_scores: torch.Tensor,
    chunk_offset: int,
    k: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge a chunk's (m, n) scores (ids ``chunk_offset + column``) into a running (m, k) top-k."""
    top = min(k, chunk_scores.shape[1])
    scores, columns = torch.topk(chunk_scores, top, dim=1)
    ids = columns + chunk_offset
    if best_scores is not None:
        scores = torch.cat([best_scores, scores], dim=1)
        ids = torch.cat([best_ids, ids], dim=1)
        scores, order = torch.topk(scores, min(k, scores.shape[1]), dim=1)
        ids = torch.gather(ids, 1, order)
    return scores, ids
