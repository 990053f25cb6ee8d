"""TurboQuant as a nearest-neighbour index (paper §4.4; Fig. 5 and Table 2 of arXiv v1).

Indexing is data-oblivious: no training, each database vector is quantized on its own by TurboQuant_mse
(Algorithm 1) or TurboQuant_prod (Algorithm 2), streamed over the database in chunks, and only the packed
codes and per-vector norms are kept. Search never reconstructs database vectors in the original space.
Every stored vector's estimated inner product with a query q is a sum of *stages*, as the quantizer describes them
(``quantizer.score_stages()``, :class:`turboquant.ScoreStage`),

    ⟨q, x̃⟩ = ‖x‖ · Σ_s w_s(x) · ⟨T_s q, c_s[codes_s(x)]⟩,

with the query transform T_s applied once per query:

* MSE stage (both variants): T = Π (the rotation), c = the Lloyd-Max centroids, w = 1, because
  x̃_mse = ‖x‖ Πᵀ c[idx] (Algorithm 1, DeQuant_mse).
* QJL stage (``variant="prod"``): the residual r = x/‖x‖ − x̃_mse/‖x‖ is stored as (sign(S r), ‖r‖) and
  dequantized as √(π/2)/d · ‖r‖ · Sᵀ sign(S r) (Definition 1, Algorithm 2), so T = S, c = (−1, +1) and
  w = √(π/2)/d · ‖r‖.

Search paths (``search_path``):

* ``"fastscan"`` (CPU, opt-in: ``scorer="fastscan"`` or ``"auto"``; 1, 2 or 4 bits for mse, 2 or 4 for
  prod, faiss installed): the codes are also kept in faiss's fast-scan layout (:mod:`turboquant.ann.fastscan`,
  converted at ``add``), which proposes ``rerank_factor · k`` candidates per query from 8-bit in-register
  lookup tables; the candidates are then re-scored with the exact estimator above (norms, per-vector QJL
  weights) and the best k returned. Queries whose candidates cannot rule out a better unseen row (a bound
  from the largest norm and the candidate-score error seen) get more candidates, so the answer is the
  dense scorer's unless that error estimate is exceeded. faiss sums 8-bit table entries in 16 bits; a
  guard sub-quantizer keeps every sum below 2¹⁶ (:mod:`turboquant.ann.fastscan`), without which rows
  scoring far above the rest wrapped around at M ≳ 260 sub-quantizers (benchmarks/NOTES.md).
* ``"dense"`` / ``"lut"`` (CPU): every stage scored chunk by chunk with :mod:`turboquant.ann.scoring` —
  decoding a chunk through a byte table and one GEMM with all queries, or per-query byte lookup tables —
  and a running top-k merged across chunks.
* ``"device"`` (``device`` a CUDA device, every variant and dimension): the codes stay on the device and
  each chunk is scored by the quantizer's own ``inner_product`` — the fused Triton scores kernel where the
  quantizer has one (``backend="auto"`` on CUDA, or ``"triton"``), its torch path otherwise — with the
  running top-k kept on the device. ``backend="triton"`` on the CPU (Triton's interpreter) also takes it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

import turboquant as tq
from turboquant.ann.base import VectorIndex, as_float_tensor
from turboquant.ann.scoring import CodeDecoder, candidate_scores, dense_scores, lut_scores, lut_tables, merge_top_k
from turboquant.backends import ANN_SCORERS as SCORERS
from turboquant.backends import ann_search_path, fastscan_layout, lut_layout

__all__ = ["TurboQuantIndex", "SCORERS", "VARIANTS"]

VARIANTS = ("mse", "prod")
_SMALL_BATCH = 16  # queries transformed on one thread (see _transform)
_MAX_DIM = 1 << 16  # constructing a Haar rotation costs O(d³): a larger saved dim is refused before building


@dataclass(frozen=True)
class _Stage:
    """One additive term of the score: codes in ``codes_key``, decoded by ``decoder``, weighted per row."""

    codes_key: str
    decoder: CodeDecoder
    query_transform: Callable[[torch.Tensor], torch.Tensor]
    row_weight_key: str | None  # per-row weight array (None: weight 1)
    weight_scale: float  # constant factor on the per-row weight
    mean_row_weight: float  # E[row weight] for unit vectors (the fast-scan candidate score uses it)


def _array_keys(variant: str) -> tuple[str, ...]:
    return ("codes", "norms") if variant == "mse" else ("codes", "norms", "qjl_signs", "residual_norms")


class TurboQuantIndex(VectorIndex):
    """Maximum-inner-product index over TurboQuant codes.

    Args:
        dim: vector dimension d.
        bits: total bits per coordinate b (for ``prod``: b−1 MSE bits + 1 QJL bit; needs b ≥ 2).
        variant: ``"mse"`` (Algorithm 1) or ``"prod"`` (Algorithm 2, unbiased inner products).
        rotation: ``"haar"`` (the paper's Π) or ``"hadamard"`` (randomized Hadamard substitute).
        seed: seed of the rotation (and of the QJL matrix); fixes the index's random state completely.
        scorer: CPU search path: ``"fastscan"`` (faiss fast-scan candidates + exact re-rank), ``"dense"``
            (decode a chunk, one GEMM for all queries), ``"lut"`` (per-query byte lookup tables) or
            ``"auto"`` (fastscan where it exists, else dense; per search, dense when a cost estimate says
            the re-rank of many candidates for a large batch would cost more, see ``_fastscan_pays``). ``dense`` and ``lut`` compute the same scores
            (to float32 rounding); ``fastscan`` returns those scores for the rows it re-ranks.
        rerank_factor: the fast-scan path re-ranks ``rerank_factor · k`` candidates per query.
        fastscan_shards: fast-scan indexes the rows are dealt to (one query's shards are scanned in parallel
            threads; a batch pays faiss's per-call lookup-table set-up once per shard); None: torch's threads.
        chunk_size: database rows quantized or scored per step (bounds the working memory).
        query_block: queries scored together per step on the dense and device paths.
        backend: the quantizer's backend (``TurboQuantMSE``/``TurboQuantProd`` ``backend``): ``"auto"``
            (Triton on CUDA, the fused numba encoder on the CPU when numba is installed), ``"numba"``,
            ``"triton"`` or ``"torch"`` (the reference). :attr:`encoder` says which one ``add`` runs.
        device: where the quantizer works and the codes live (``"cpu"`` or a CUDA device).
    """

    method: ClassVar[str] = "turboquant"

    def __init__(
        self,
        dim: int,
        bits: int,
        variant: str = "mse",
        rotation: str = "haar",
        seed: int = 0,
        scorer: str = "dense",
        rerank_factor: int = 4,
        fastscan_shards: int | None = None,
        chunk_size: int = 16384,
        query_block: int = 1024,
        backend: str = "auto",
        device: str | None = None,
    ) -> None:
        super().__init__(dim, bits)
        if self.dim > _MAX_DIM:
            raise ValueError(f"dim must be at most {_MAX_DIM}, got {self.dim}")
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
        if variant == "prod" and self.bits < 2:
            raise ValueError("variant='prod' spends 1 bit on QJL and needs bits >= 2")
        if scorer not in SCORERS:
            raise ValueError(f"scorer must be one of {SCORERS}, got {scorer!r}")
        shards = torch.get_num_threads() if fastscan_shards is None else fastscan_shards
        for name, value in (("chunk_size", chunk_size), ("query_block", query_block), ("rerank_factor", rerank_factor),
                            ("fastscan_shards", shards)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self.variant, self.rotation_kind, self.seed = variant, rotation, int(seed)
        self.scorer, self.rerank_factor, self.fastscan_shards = scorer, int(rerank_factor), fastscan_shards
        self._shards = int(shards)
        self.chunk_size, self.query_block = int(chunk_size), int(query_block)
        self.backend = backend
        self.device = torch.device(device if device is not None else "cpu")
        quantizer_cls = tq.TurboQuantMSE if variant == "mse" else tq.TurboQuantProd
        self.quantizer = quantizer_cls(self.dim, self.bits, rotation=rotation, seed=self.seed, backend=backend,
                                       device=self.device)
        self._stages = self._make_stages()
        self.search_choice = ann_search_path(self.scorer, self.device, self.quantizer.backend_choice.chosen,
                                             [stage.decoder.bits for stage in self._stages])
        self.search_path = self.search_choice.chosen  # which scorer reads the codes (turboquant.backends)
        self._reset()

    # ------------------------------------------------------------------ structure
    @property
    def name(self) -> str:
        return f"turboquant_{self.variant}"

    @property
    def encoder(self) -> str:
        """The encoder ``add`` runs: ``"triton"``, ``"numba"`` (fused CPU encoder) or ``"torch"``. With
        ``backend="auto"``, "numba" holds for chunks of at least 65,536 coordinates (``chunk_size`` rows × dim);
        smaller chunks (a tiny ``add``) take the torch path, which is faster there."""
        return self.quantizer.backend_choice.chosen

    @property
    def kernel_search(self) -> bool:
        """Whether search scores through the quantizer's ``inner_product`` with codes on ``device``."""
        return self.search_path == "device"

    @property
    def supports_lut(self) -> bool:
        """Whether every stage's code width divides 8 (byte lookup tables need whole codes per byte)."""
        return lut_layout([stage.decoder.bits for stage in self._stages])

    @property
    def supports_fastscan(self) -> bool:
        """Whether the stages' bits per coordinate divide 4 (the fast-scan sub-quantizer code width)."""
        return fastscan_layout([stage.decoder.bits for stage in self._stages])

    def _make_stages(self) -> tuple[_Stage, ...]:
        return tuple(_Stage(codes_key=stage.codes, decoder=CodeDecoder(stage.centroids.cpu(), stage.bits, self.dim),
                            query_transform=stage.query_transform, row_weight_key=stage.row_weight,
                            weight_scale=stage.scale, mean_row_weight=stage.mean_row_weight)
                     for stage in self.quantizer.score_stages())

    # ------------------------------------------------------------------ storage
    @property
    def ntotal(self) -> int:
        return sum(block.shape[0] for block in self._blocks["norms"])

    @property
    def nbytes(self) -> int:
        return sum(block.numel() * block.element_size() for blocks in self._blocks.values() for block in blocks)

    @property
    def model_nbytes(self) -> int:
        """The rotation Π (and QJL matrix S) as dense float32 plus the codebook; all regenerable from seed."""
        matrices = 1 if self.variant == "mse" else 2
        dense = self.dim * self.dim * 4 if self.rotation_kind == "haar" else 0
        return matrices * dense + 4 * (1 << self.quantizer.mse_bits)

    def _stored(self) -> dict[str, torch.Tensor]:
        """All stored arrays on ``device``, concatenated once after the last add()."""
        if self._arrays is None:
            self._arrays = {key: torch.cat(blocks) for key, blocks in self._blocks.items()}
            self._blocks = {key: [array] for key, array in self._arrays.items()}
        return self._arrays

    def _host(self) -> dict[str, np.ndarray]:
        """The stored arrays as NumPy (no copy on a CPU index)."""
        return {key: array.cpu().numpy() for key, array in self._stored().items()}

    # ------------------------------------------------------------------ add / remove
    def _add(self, x: torch.Tensor) -> None:
        for start in range(0, x.shape[0], self.chunk_size):
            qv = self.quantizer.quantize(x[start : start + self.chunk_size].to(self.device))
            self._append({"codes": qv.codes, "norms": qv.norms, "qjl_signs": qv.qjl_signs,
                          "residual_norms": qv.residual_norms})

    def _append(self, arrays: dict[str, torch.Tensor]) -> None:
        for key in _array_keys(self.variant):
            self._blocks[key].append(arrays[key].to(self.device))
        if self._fastscan is not None:
            self._fastscan.add([arrays[stage.codes_key].cpu().numpy() for stage in self._stages])
        self._arrays = None

    def _new_fastscan(self) -> Any:
        from turboquant.ann.fastscan import FastScanCodes, FastScanLayout, FastScanStage

        layout = FastScanLayout([FastScanStage(stage.decoder.centroids, stage.decoder.bits,
                                               stage.weight_scale * stage.mean_row_weight) for stage in self._stages],
                                self.dim)
        return FastScanCodes(layout, shards=self._shards)

    def _reset(self) -> None:
        self._blocks: dict[str, list[torch.Tensor]] = {key: [] for key in _array_keys(self.variant)}
        self._arrays: dict[str, torch.Tensor] | None = None
        self._fastscan = self._new_fastscan() if self.search_path == "fastscan" else None

    def _replace_rows(self, arrays: dict[str, np.ndarray]) -> None:
        self._reset()
        if arrays["norms"].shape[0]:
            self._append({key: torch.from_numpy(np.ascontiguousarray(array)) for key, array in arrays.items()})

    def _remove_positions(self, positions: np.ndarray) -> None:
        self._replace_rows({key: np.delete(array, positions, axis=0) for key, array in self._host().items()})

    def _reconstruct(self, position: int) -> np.ndarray:
        arrays = {key: array[position : position + 1] for key, array in self._stored().items()}
        return self.quantizer.dequantize(self._quantized(arrays))[0].cpu().numpy()

    def _quantized(self, arrays: dict[str, torch.Tensor]) -> tq.QuantizedVectors:
        return self.quantizer.stored(arrays["codes"], arrays["norms"], arrays.get("qjl_signs"),
                                     arrays.get("residual_norms"))

    # ------------------------------------------------------------------ search
    def scores(self, queries: Any) -> np.ndarray:
        """Estimated inner products ⟨q, x̃⟩, shape (n_queries, ntotal), by the exact estimator."""
        if self.ntotal == 0:
            raise ValueError("the index is empty: add() vectors before scores()")
        queries = as_float_tensor(queries, self.dim, "queries")
        if self.kernel_search:
            return torch.cat([self._device_scores(queries.to(self.device), start, min(start + self.chunk_size, self.ntotal))
                              for start in range(0, self.ntotal, self.chunk_size)], dim=1).cpu().numpy()
        return self._chunk_scores(self._transform(queries), self._host(), 0, self.ntotal).numpy()

    def _device_scores(self, queries: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        """(m, stop − start) scores of device queries by the quantizer's ``inner_product`` on device codes."""
        arrays = {key: array[start:stop] for key, array in self._stored().items()}
        return self.quantizer.inner_product(queries, self._quantized(arrays))

    def _transform(self, queries: torch.Tensor) -> list[np.ndarray]:
        """Each stage's query transform T_s q, applied once per query. A few queries on the CPU are
        transformed on one thread: a (m, d)·(d, d) product with m ≲ 16 is microseconds of work, and a
        parallel region around it waits for a second thread (tens of ms on a loaded 2-core machine)."""
        tensor = queries.to(self.device)
        threads = torch.get_num_threads()
        if self.device.type == "cpu" and tensor.shape[0] < _SMALL_BATCH and threads > 1:
            torch.set_num_threads(1)
        try:
            return [stage.query_transform(tensor).float().cpu().numpy() for stage in self._stages]
        finally:
            torch.set_num_threads(threads)

    def _chunk_scores(
        self, transformed: list[np.ndarray], arrays: dict[str, np.ndarray], start: int, stop: int
    ) -> torch.Tensor:
        total: torch.Tensor | None = None
        for stage, queries in zip(self._stages, transformed):
            packed = arrays[stage.codes_key][start:stop]
            if self.search_path == "lut":
                part = lut_scores(lut_tables(queries, stage.decoder), packed)
            else:
                part = dense_scores(queries, packed, stage.decoder)
            if stage.row_weight_key is not None:
                weights = stage.weight_scale * arrays[stage.row_weight_key][start:stop].astype(np.float32)
                part = part * torch.from_numpy(weights)
            total = part if total is None else total + part
        return total * torch.from_numpy(arrays["norms"][start:stop].astype(np.float32))

    def _search(self, queries: torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray]:
        if self.search_path == "device":
            return self._device_search(queries.to(self.device), k)
        if self.search_path == "fastscan" and (self.scorer == "fastscan" or self._fastscan_pays(queries.shape[0], k)):
            return self._fastscan_search(queries, k)
        arrays = self._host()
        all_scores, all_ids = [], []
        block = self.query_block if self.search_path == "dense" else queries.shape[0]
        for q_start in range(0, queries.shape[0], block):
            transformed = self._transform(queries[q_start : q_start + block])
            best_scores = best_ids = None
            for start in range(0, self.ntotal, self.chunk_size):
                stop = min(start + self.chunk_size, self.ntotal)
                chunk = self._chunk_scores(transformed, arrays, start, stop)
                best_scores, best_ids = merge_top_k(best_scores, best_ids, chunk, start, k)
            all_scores.append(best_scores.numpy())
            all_ids.append(best_ids.numpy())
        return np.concatenate(all_scores), np.concatenate(all_ids)

    def _fastscan_pays(self, m: int, k: int) -> bool:
        """``scorer="auto"``: whether fast-scan + re-rank is estimated cheaper than the dense scorer for ``m``
        queries and top ``k``, in decoded-float units per stage (a crude model of the 2-core measurements in
        benchmarks/NOTES.md): re-rank 2 per candidate coordinate plus the SIMD scan 1/64 per coordinate and
        query, against the dense decode, 1 per coordinate and query block, plus its GEMM, 1/32 per coordinate
        and query. Large k with large query batches on small databases goes dense."""
        n, d = self.ntotal, self.dim
        candidates = min(n, self.rerank_factor * k)
        fast = m * candidates * d * 2 + m * n * d / 64
        dense = n * d * -(-m // self.query_block) + m * n * d / 32
        return fast < dense

    def _fastscan_search(self, queries: torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Fast-scan candidates re-scored by the exact estimator; the best k of them.

        A row outside the c candidates has a candidate score at most the c-th one, s_c, so its exact score
        is at most ‖x‖_max · (s_c + ε), with ε the largest gap between candidate and exact unit-norm score
        seen among the candidates (table quantization; for prod also w̄ for w(x)), doubled. Queries whose
        k-th exact score does not beat that bound are searched again with 4× the candidates, until it
        does or every row is a candidate. With unit-norm data the first round almost always suffices."""
        transformed = self._transform(queries)
        norms = self._host()["norms"]
        high, low = float(norms.max()), float(norms.min())
        out_scores = np.empty((queries.shape[0], k), np.float32)
        out_ids = np.empty((queries.shape[0], k), np.int64)
        todo, count = np.arange(queries.shape[0]), min(self.ntotal, self.rerank_factor * k)
        while len(todo):
            part = [t[todo] for t in transformed]
            candidate, ids = self._fastscan.search(part, count)
            unit = self._candidate_scores(part, ids)
            exact = unit * norms[ids]
            order = np.argsort(-exact, axis=1, kind="stable")[:, :k]
            out_scores[todo] = np.take_along_axis(exact, order, 1)
            out_ids[todo] = np.take_along_axis(ids, order, 1)
            if count == self.ntotal:
                break
            margin = 2 * np.abs(candidate - unit).max(axis=1)
            bound = candidate[:, -1] + margin
            bound = np.where(bound > 0, high * bound, low * bound)
            todo = todo[bound >= out_scores[todo, -1]]
            count = min(self.ntotal, 4 * count)
        return out_scores, out_ids

    def _candidate_scores(self, transformed: list[np.ndarray], candidates: np.ndarray) -> np.ndarray:
        """(m, c) exact unit-norm estimates ⟨q_i, x̃_j⟩ / ‖x_j‖ for the rows ``candidates[i]`` of query i.
        A batch of queries is split into one block per fast-scan thread (NumPy's gathers and products release
        the GIL); a few queries are scored on the calling thread."""
        arrays, m = self._host(), candidates.shape[0]
        parts = self._fastscan.threads if m >= _SMALL_BATCH else 1
        edges = [m * i // parts for i in range(parts + 1)]
        blocks = [([t[a:b] for t in transformed], candidates[a:b]) for a, b in zip(edges, edges[1:])]
        return np.concatenate(self._fastscan.map(lambda block: self._candidate_block(arrays, *block), blocks))

    def _candidate_block(
        self, arrays: dict[str, np.ndarray], transformed: list[np.ndarray], candidates: np.ndarray
    ) -> np.ndarray:
        total = np.zeros(candidates.shape, np.float32)
        for stage, queries in zip(self._stages, transformed):
            part = candidate_scores(queries, arrays[stage.codes_key], candidates, stage.decoder)
            if stage.row_weight_key is not None:
                part *= stage.weight_scale * arrays[stage.row_weight_key][candidates]
            total += part
        return total

    def _device_search(self, queries: torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-k on the quantizer's device, each chunk scored by its ``inner_product``."""
        all_scores, all_ids = [], []
        for q_start in range(0, queries.shape[0], self.query_block):
            block = queries[q_start : q_start + self.query_block]
            best_scores = best_ids = None
            for start in range(0, self.ntotal, self.chunk_size):
                chunk = self._device_scores(block, start, min(start + self.chunk_size, self.ntotal))
                best_scores, best_ids = merge_top_k(best_scores, best_ids, chunk, start, k)
            all_scores.append(best_scores.cpu().numpy())
            all_ids.append(best_ids.cpu().numpy())
        return np.concatenate(all_scores), np.concatenate(all_ids)

    # ------------------------------------------------------------------ persistence
    def config(self) -> dict[str, Any]:
        return {
            "dim": self.dim,
            "bits": self.bits,
            "variant": self.variant,
            "rotation": self.rotation_kind,
            "seed": self.seed,
            "scorer": self.scorer,
            "rerank_factor": self.rerank_factor,
            "fastscan_shards": self.fastscan_shards,
            "chunk_size": self.chunk_size,
            "query_block": self.query_block,
            "backend": self.backend,
            "device": str(self.device),
        }

    def state_arrays(self) -> dict[str, np.ndarray]:
        if self.ntotal == 0:
            return {key: np.zeros((0,), np.uint8) for key in _array_keys(self.variant)}
        return dict(self._host())

    @classmethod
    def check_saved(cls, config: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        """ValueError unless ``arrays`` are what an index with ``config`` saves: the right keys, dtypes,
        shapes (code widths follow from dim and bits) and finite, non-negative norms. Runs before any
        quantizer is built, so a file claiming a huge dimension fails here, in microseconds."""
        variant, dim, bits = config.get("variant", "mse"), config.get("dim"), config.get("bits")
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
        for name, value in (("dim", dim), ("bits", bits)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"config {name} must be a positive integer, got {value!r}")
        if dim > _MAX_DIM:
            raise ValueError(f"config dim must be at most {_MAX_DIM}, got {dim}")
        keys = _array_keys(variant)
        if set(arrays) != set(keys):
            raise ValueError(f"a TurboQuant {variant} index saves arrays {sorted(keys)}, found {sorted(arrays)}")
        n = arrays["norms"].shape[0] if arrays["norms"].ndim else -1
        if n == 0 and all(array.size == 0 for array in arrays.values()):
            return
        mse_bits = bits if variant == "mse" else bits - 1
        expected = {"codes": ((n, tq.packed_size(dim, mse_bits)), np.uint8), "norms": ((n,), np.float32),
                    "qjl_signs": ((n, tq.packed_size(dim, 1)), np.uint8), "residual_norms": ((n,), np.float32)}
        for key in keys:
            shape, dtype = expected[key]
            if arrays[key].shape != shape or arrays[key].dtype != dtype:
                raise ValueError(f"array {key!r} must be {np.dtype(dtype).name} of shape {shape} for dim={dim}, "
                                 f"bits={bits}, {n} vectors; got {arrays[key].dtype.name} {arrays[key].shape}")
        for key in ("norms", "residual_norms")[: 1 if variant == "mse" else 2]:
            values = arrays[key]
            if not np.isfinite(values).all() or (values < 0).any():
                raise ValueError(f"array {key!r} holds NaN, infinite or negative values")

    def load_state_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        self.check_saved(self.config(), arrays)
        self._replace_rows(arrays)
