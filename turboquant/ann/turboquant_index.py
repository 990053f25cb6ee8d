"""TurboQuant as a nearest-neighbour index (paper §4.4; Fig. 5 and Table 2 of arXiv v1).

Indexing is data-oblivious: no training, each database vector is quantized on its own by TurboQuant_mse
(Algorithm 1) or TurboQuant_prod (Algorithm 2), streamed over the database in chunks, and only the packed
codes and per-vector norms are kept. Search never reconstructs database vectors in the original space.
Every stored vector's estimated inner product with a query q is a sum of *stages*,

    ⟨q, x̃⟩ = ‖x‖ · Σ_s w_s(x) · ⟨T_s q, c_s[codes_s(x)]⟩,

with the query transform T_s applied once per query:

* MSE stage (both variants): T = Π (the rotation), c = the Lloyd-Max centroids, w = 1, because
  x̃_mse = ‖x‖ Πᵀ c[idx] (Algorithm 1, DeQuant_mse).
* QJL stage (``variant="prod"``): the residual r = x/‖x‖ − x̃_mse/‖x‖ is stored as (sign(S r), ‖r‖) and
  dequantized as √(π/2)/d · ‖r‖ · Sᵀ sign(S r) (Definition 1, Algorithm 2), so T = S, c = (−1, +1) and
  w = √(π/2)/d · ‖r‖.

Each stage is scored chunk by chunk with :mod:`turboquant.ann.scoring` — decoding a chunk through a
byte table and one GEMM with all queries (``scorer="dense"``), or per-query byte lookup tables
(``scorer="lut"``) — and a running top-k is merged across chunks.

When the quantizer runs the Triton kernels (``device`` a CUDA device with ``backend="auto"``, or
``backend="triton"``), the codes are copied to the device once and search scores each chunk with the
quantizer's own ``inner_product`` — the fused Triton scores kernel, which reads the packed codes
directly — and keeps the running top-k on the device.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

import turboquant as tq
from turboquant.ann.base import VectorIndex, as_float_matrix
from turboquant.ann.scoring import CodeDecoder, dense_scores, lut_scores, lut_tables, merge_top_k

__all__ = ["TurboQuantIndex", "SCORERS", "VARIANTS"]

VARIANTS = ("mse", "prod")
SCORERS = ("dense", "lut")


@dataclass(frozen=True)
class _Stage:
    """One additive term of the score: codes in ``codes_key``, decoded by ``decoder``, weighted per row."""

    codes_key: str
    decoder: CodeDecoder
    query_transform: Callable[[torch.Tensor], torch.Tensor]
    row_weight_key: str | None  # per-row weight array (None: weight 1)
    weight_scale: float  # constant factor on the per-row weight


class TurboQuantIndex(VectorIndex):
    """Maximum-inner-product index over TurboQuant codes.

    Args:
        dim: vector dimension d.
        bits: total bits per coordinate b (for ``prod``: b−1 MSE bits + 1 QJL bit; needs b ≥ 2).
        variant: ``"mse"`` (Algorithm 1) or ``"prod"`` (Algorithm 2, unbiased inner products).
        rotation: ``"haar"`` (the paper's Π) or ``"hadamard"`` (randomized Hadamard substitute).
        seed: seed of the rotation (and of the QJL matrix); fixes the index's random state completely.
        scorer: ``"dense"`` (decode a chunk, one GEMM for all queries; fastest for query batches on the
            2-core CPU measured) or ``"lut"`` (per-query byte lookup tables; no decode; fastest for one
            or two queries). Both compute the same scores (to float32 rounding).
        chunk_size: database rows quantized or scored per step (bounds the working memory).
        query_block: queries scored together per step on the dense path.
        backend: the quantizer's backend (``TurboQuantMSE``/``TurboQuantProd`` ``backend``): ``"auto"``
            (Triton on CUDA, the fused numba encoder on the CPU when numba is installed), ``"numba"``,
            ``"triton"`` or ``"torch"`` (the reference). :attr:`encoder` says which one ``add`` runs.
        device: where the quantizer works (``"cpu"`` or a CUDA device); the stored codes live on the host.
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
        chunk_size: int = 16384,
        query_block: int = 1024,
        backend: str = "auto",
        device: str | None = None,
    ) -> None:
        super().__init__(dim, bits)
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
        if variant == "prod" and self.bits < 2:
            raise ValueError("variant='prod' spends 1 bit on QJL and needs bits >= 2")
        if scorer not in SCORERS:
            raise ValueError(f"scorer must be one of {SCORERS}, got {scorer!r}")
        if chunk_size < 1 or query_block < 1:
            raise ValueError(f"chunk_size and query_block must be positive, got {chunk_size}, {query_block}")
        self.variant, self.rotation_kind, self.seed = variant, rotation, int(seed)
        self.scorer, self.chunk_size, self.query_block = scorer, int(chunk_size), int(query_block)
        self.backend = backend
        self.device = torch.device(device if device is not None else "cpu")
        quantizer_cls = tq.TurboQuantMSE if variant == "mse" else tq.TurboQuantProd
        self.quantizer = quantizer_cls(self.dim, self.bits, rotation=rotation, seed=self.seed, backend=backend,
                                       device=self.device)
        self._stages = self._make_stages()
        if scorer == "lut" and not self.supports_lut:
            widths = [stage.decoder.bits for stage in self._stages]
            raise ValueError(f"scorer='lut' needs code widths dividing 8, got {widths} bits (use scorer='dense')")
        self._blocks: dict[str, list[np.ndarray]] = {key: [] for key in self._array_keys()}
        self._arrays: dict[str, np.ndarray] | None = None
        self._device_copy: dict[str, torch.Tensor] | None = None  # the stored arrays on the quantizer's device

    # ------------------------------------------------------------------ structure
    @property
    def name(self) -> str:
        return f"turboquant_{self.variant}"

    @property
    def encoder(self) -> str:
        """The encoder ``add`` runs: ``"triton"``, ``"numba"`` (fused CPU encoder) or ``"torch"``. With
        ``backend="auto"``, "numba" holds for chunks of at least 65,536 coordinates (``chunk_size`` rows × dim);
        smaller chunks (a tiny ``add``) take the torch path, which is faster there."""
        if self.quantizer._triton:
            return "triton"
        return "numba" if self.quantizer._numba else "torch"

    @property
    def kernel_search(self) -> bool:
        """Whether search scores through the quantizer's ``inner_product`` (the Triton scores kernel)."""
        return bool(self.quantizer._triton)

    def _array_keys(self) -> tuple[str, ...]:
        return ("codes", "norms") if self.variant == "mse" else ("codes", "norms", "qjl_signs", "residual_norms")

    def _make_stages(self) -> tuple[_Stage, ...]:
        q = self.quantizer
        rotation = q.rotation
        mse = _Stage(
            codes_key="codes",
            decoder=CodeDecoder(q.codebook.centroids, q.mse_bits, self.dim),
            query_transform=rotation.apply,
            row_weight_key=None,
            weight_scale=1.0,
        )
        if self.variant == "mse":
            return (mse,)
        qjl = _Stage(
            codes_key="qjl_signs",
            decoder=CodeDecoder(np.array([-1.0, 1.0]), 1, self.dim),  # sign bit 1 = +1 (QJL.sign_bits)
            query_transform=q.qjl.sketch,
            row_weight_key="residual_norms",
            weight_scale=math.sqrt(math.pi / 2) / self.dim,
        )
        return mse, qjl

    @property
    def supports_lut(self) -> bool:
        """Whether every stage's code width divides 8 (byte lookup tables need whole codes per byte)."""
        return all(stage.decoder.byte_aligned for stage in self._stages)

    # ------------------------------------------------------------------ storage
    @property
    def ntotal(self) -> int:
        return sum(block.shape[0] for block in self._blocks["norms"])

    @property
    def nbytes(self) -> int:
        return sum(block.nbytes for blocks in self._blocks.values() for block in blocks)

    @property
    def model_nbytes(self) -> int:
        """The rotation Π (and QJL matrix S) as dense float32 plus the codebook; all regenerable from seed."""
        matrices = 1 if self.variant == "mse" else 2
        dense = self.dim * self.dim * 4 if self.rotation_kind == "haar" else 0
        return matrices * dense + 4 * (1 << self.quantizer.mse_bits)

    def _stored(self) -> dict[str, np.ndarray]:
        """All stored arrays, concatenated once after the last add()."""
        if self._arrays is None:
            self._arrays = {key: np.concatenate(blocks) for key, blocks in self._blocks.items()}
            self._blocks = {key: [array] for key, array in self._arrays.items()}
        return self._arrays

    # ------------------------------------------------------------------ add
    def _add(self, x: np.ndarray) -> None:
        for start in range(0, x.shape[0], self.chunk_size):
            qv = self.quantizer.quantize(torch.from_numpy(x[start : start + self.chunk_size]).to(self.device))
            self._append(qv)
        self._arrays = self._device_copy = None

    def _append(self, qv: Any) -> None:
        self._blocks["codes"].append(qv.codes.cpu().numpy())
        self._blocks["norms"].append(qv.norms.cpu().numpy())
        if self.variant == "prod":
            self._blocks["qjl_signs"].append(qv.qjl_signs.cpu().numpy())
            self._blocks["residual_norms"].append(qv.residual_norms.cpu().numpy())

    # ------------------------------------------------------------------ search
    def scores(self, queries: Any) -> np.ndarray:
        """Estimated inner products ⟨q, x̃⟩, shape (n_queries, ntotal), by this index's scorer."""
        if self.ntotal == 0:
            raise ValueError("the index is empty: add() vectors before scores()")
        queries = as_float_matrix(queries, self.dim, "queries")
        if self.kernel_search:
            query_tensor = torch.from_numpy(queries).to(self.device)
            return torch.cat([self._kernel_scores(query_tensor, start, min(start + self.chunk_size, self.ntotal))
                              for start in range(0, self.ntotal, self.chunk_size)], dim=1).cpu().numpy()
        return self._chunk_scores(self._transform(queries), self._stored(), 0, self.ntotal).numpy()

    def _kernel_scores(self, queries: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        """(m, stop − start) scores of device queries by the quantizer's ``inner_product`` on device codes."""
        if self._device_copy is None:
            self._device_copy = {key: torch.from_numpy(array).to(self.device) for key, array in self._stored().items()}
        arrays = {key: array[start:stop] for key, array in self._device_copy.items()}
        quantizer = self.quantizer
        stored = tq.QuantizedVectors(
            codes=arrays["codes"], norms=arrays["norms"], qjl_signs=arrays.get("qjl_signs"),
            residual_norms=arrays.get("residual_norms"), dim=self.dim, bits=self.bits, mse_bits=quantizer.mse_bits,
            signature=quantizer.signature, dtype=torch.float32)
        return quantizer.inner_product(queries, stored)

    def _transform(self, queries: np.ndarray) -> list[np.ndarray]:
        """Each stage's query transform T_s q, applied once per query on the quantizer's device (a CUDA index
        without a search kernel, e.g. TurboQuant_prod above the fused kernel's dimension, scores on the host)."""
        tensor = torch.from_numpy(queries).to(self.device)
        return [stage.query_transform(tensor).float().cpu().numpy() for stage in self._stages]

    def _chunk_scores(
        self, transformed: list[np.ndarray], arrays: dict[str, np.ndarray], start: int, stop: int
    ) -> torch.Tensor:
        total: torch.Tensor | None = None
        for stage, queries in zip(self._stages, transformed):
            packed = arrays[stage.codes_key][start:stop]
            if self.scorer == "dense":
                part = dense_scores(queries, packed, stage.decoder)
            else:
                part = lut_scores(lut_tables(queries, stage.decoder), packed)
            if stage.row_weight_key is not None:
                weights = stage.weight_scale * arrays[stage.row_weight_key][start:stop].astype(np.float32)
                part = part * torch.from_numpy(weights)
            total = part if total is None else total + part
        return total * torch.from_numpy(arrays["norms"][start:stop].astype(np.float32))

    def _search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        if self.kernel_search:
            return self._kernel_search(queries, k)
        arrays = self._stored()
        all_scores, all_ids = [], []
        block = self.query_block if self.scorer == "dense" else queries.shape[0]
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

    def _kernel_search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-k on the quantizer's device, each chunk scored by the Triton scores kernel."""
        query_tensor = torch.from_numpy(queries).to(self.device)
        all_scores, all_ids = [], []
        for q_start in range(0, queries.shape[0], self.query_block):
            block = query_tensor[q_start : q_start + self.query_block]
            best_scores = best_ids = None
            for start in range(0, self.ntotal, self.chunk_size):
                chunk = self._kernel_scores(block, start, min(start + self.chunk_size, self.ntotal))
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
            "chunk_size": self.chunk_size,
            "query_block": self.query_block,
            "backend": self.backend,
            "device": str(self.device),
        }

    def state_arrays(self) -> dict[str, np.ndarray]:
        if self.ntotal == 0:
            return {key: np.zeros((0,), np.uint8) for key in self._array_keys()}
        return dict(self._stored())

    def load_state_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        missing = set(self._array_keys()) - set(arrays)
        if missing:
            raise ValueError(f"saved TurboQuant index lacks arrays {sorted(missing)}")
        counts = {arrays[key].shape[0] for key in self._array_keys()}
        if len(counts) != 1:
            raise ValueError(f"saved TurboQuant arrays disagree on the number of vectors: {counts}")
        if counts != {0}:
            expected = self._stages[0].decoder.bytes_per_row
            if arrays["codes"].ndim != 2 or arrays["codes"].shape[1] != expected:
                raise ValueError(f"saved codes have shape {arrays['codes'].shape}, expected (n, {expected})")
            self._blocks = {key: [np.ascontiguousarray(arrays[key])] for key in self._array_keys()}
        self._arrays = self._device_copy = None
