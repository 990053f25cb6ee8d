"""TurboQuant_mse (Algorithm 1), QJL (Definition 1) and TurboQuant_prod (Algorithm 2).

All three quantize vectors of any norm: ‖x‖ is stored as a float32 and the unit vector x/‖x‖ is what
the algorithms see (paper, Section 3: "store ‖x‖ in floating point and rescale"); a zero vector is
stored with norm 0 and reconstructed exactly, and every other finite vector keeps its direction whatever
its magnitude (the norm is taken after rescaling by max |x_j|: ``turboquant._validation.unit_vectors``).
Inputs may have any leading batch shape and be float16, bfloat16, float32 or float64; arithmetic is float32
(float64 inputs are normalised in float64). Work is chunked over vectors so memory stays bounded.

Notation (paper): Π a random rotation, c the Lloyd-Max codebook of the rotated coordinates (Eq. 4),
S a d×d matrix of i.i.d. N(0, 1) entries.

* TurboQuant_mse(b):   idx_j = argmin_k |(Πx)_j − c_k|,   x̃ = Πᵀ c[idx].
* QJL:                 z = sign(Sx),   x̃ = √(π/2)/d · Sᵀz   (unbiased: E x̃ = x, Lemma 4).
* TurboQuant_prod(b):  TurboQuant_mse(b−1), residual r = x − x̃_mse, store (idx, sign(Sr), ‖r‖),
                       x̃ = x̃_mse + √(π/2)/d · ‖r‖ · Sᵀ sign(Sr)   (unbiased for inner products, Thm. 2).

``inner_product(y, q)`` estimates ⟨y, x⟩ for every query y and stored x without reconstructing x̃ in the
original basis: the query is rotated (and sketched by S) once, and the stored codes are decoded to
centroid values chunk by chunk, so the cost is one (m×d)·(d×n) product instead of n rotations.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from ._random import stream_generator
from ._validation import all_finite  # noqa: F401  (re-exported: turboquant.ann imports it from here)
from ._validation import (SAFE_NORMS, check_choice, check_device, check_finite, check_int, check_vectors,
                          unit_vectors)
from .backends import Choice, quantizer_backend
from .codebook import MAX_BITS, SUPPORTED_DENSITIES, Codebook, lloyd_max_codebook
from .codes import QuantizedVectors
from .packing import pack_codes, packed_size, unpack_codes
from .rotation import ROTATION_KINDS, Rotation, make_rotation

__all__ = ["QuantizedVectors", "ScoreStage", "TurboQuantMSE", "TurboQuantProd", "QJL"]

_DEFAULT_CHUNK = 16384
_NORM_DTYPE = torch.float32


def _check_norms(norms: torch.Tensor) -> None:
    """ValueError unless every ‖x_i‖ (computed by :func:`unit_vectors`, in float32 or float64) is finite and
    representable as the float32 that is stored (a nonzero norm must not underflow to 0 or overflow)."""
    if not bool(torch.isfinite(norms).all()):
        raise ValueError("x contains NaN or Inf")
    stored = norms.to(_NORM_DTYPE)
    outside = ~torch.isfinite(stored) | ((stored == 0) & (norms != 0))
    if bool(outside.any()):
        value = float(norms[outside][0])
        raise ValueError(f"x has a vector whose norm ({value:.3g}) overflows or underflows float32, the dtype "
                         "norms are stored in; rescale x")


#: ``backend="auto"`` hands inputs of at least this many coordinates to the numba CPU encoder. Below it the
#: torch path is faster: starting numba's parallel region has a fixed cost per call (thread wake-up), which a KV
#: cache writing one token per layer and step would pay every call (benchmarks/NOTES.md, "Constants").
_NUMBA_MIN_COORDINATES = 1 << 16


@dataclass(frozen=True)
class ScoreStage:
    """One additive term of a quantizer's inner-product estimate, the form every scorer evaluates
    (``inner_product`` here, the ANN index's dense / lookup-table / fast-scan paths):

        ⟨y, x̃⟩ = ‖x‖ · Σ_s scale_s · w_s(x) · ⟨T_s y, c_s[codes_s(x)]⟩.

    * TurboQuant_mse (Algorithm 1): T = Π, c = the Lloyd-Max centroids, w = 1, scale = 1, since x̃ = ‖x‖ Πᵀ c[idx].
    * QJL (Definition 1): T = S, c = (−1, +1) (sign bit 1 is +1), w = 1, scale = √(π/2)/d.
    * TurboQuant_prod (Algorithm 2): the (b−1)-bit MSE stage, then the QJL stage of the residual with w = ‖r‖.

    Attributes:
        codes: the :class:`QuantizedVectors` field of the stage's packed codes (``"codes"`` / ``"qjl_signs"``).
        bits: the code width.  centroids: c_s, float32 (2^bits,) on the quantizer's device.
        query_transform: T_s, queries (m, d) -> (m, d).
        row_weight: the :class:`QuantizedVectors` field of w_s (``"residual_norms"``), None for w = 1.
        scale: the constant factor.
        mean_row_weight: E[w_s] for a unit vector (1, or √D_mse(b−1) for ‖r‖, Theorem 1), for a scorer that
            cannot read w per row (fast-scan candidate scores).
    """

    codes: str
    bits: int
    centroids: torch.Tensor
    query_transform: Callable[[torch.Tensor], torch.Tensor]
    row_weight: str | None = None
    scale: float = 1.0
    mean_row_weight: float = 1.0


def _check_threads(threads: int | None) -> int | None:
    return None if threads is None else check_int(threads, "threads", low=1)


Fields = dict[str, torch.Tensor]  # QuantizedVectors' tensors by field name, one row per vector


def _capturing() -> bool:
    """Whether a CUDA graph is being captured on the current stream (never where CUDA is not available)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


class _VectorQuantizer:
    """Argument checks, norm handling, chunking and the ``quantize`` driver shared by the three quantizers.

    A subclass encodes rows (n, d) into :data:`Fields` twice over: ``_encode`` (the configured backend) and
    ``_encode_torch`` (the exact reference, whose norms are right for every finite input); rows whose norm
    the fast backends cannot trust are re-encoded by the reference (``_redo_extreme_rows``).
    """

    dim: int
    bits: int
    mse_bits: int
    device: torch.device
    chunk_size: int
    backend: str = "torch"   # as asked for ("auto", "torch", "triton", "numba")
    backend_choice: Choice   # what serves it, and why not the others (turboquant.backends.quantizer_backend)
    _side_fields: tuple[str, ...] = ()  # the QuantizedVectors fields it stores beside codes and norms
    _captured_extreme: torch.Tensor | None = None  # whether a captured graph's quantize met an extreme row

    def _configure(self, dim: int, seed: int, device: torch.device | str | None, chunk_size: int) -> None:
        self.dim = check_int(dim, "dim", low=2)
        self.seed = check_int(seed, "seed", low=0)
        self.device = check_device(device)
        self.chunk_size = check_int(chunk_size, "chunk_size", low=1)

    @property
    def signature(self) -> str:
        raise NotImplementedError

    def __repr__(self) -> str:
        return self.signature

    @property
    def _triton(self) -> bool:
        """Whether encode and scores run the Triton kernels."""
        return self.backend_choice.chosen == "triton"

    def _numba_for(self, x: torch.Tensor) -> bool:
        """Whether this call runs the numba CPU encoder: always with ``backend="numba"``; with ``"auto"`` for
        CPU inputs of at least ``_NUMBA_MIN_COORDINATES`` coordinates (small ones are faster in torch)."""
        return self.backend_choice.chosen == "numba" and x.device.type == "cpu" and (
            self.backend == "numba" or x.numel() >= _NUMBA_MIN_COORDINATES)

    def stored(self, codes: torch.Tensor, norms: torch.Tensor, qjl_signs: torch.Tensor | None = None,
               residual_norms: torch.Tensor | None = None, dtype: torch.dtype = torch.float32) -> QuantizedVectors:
        """The :class:`QuantizedVectors` of fields that this quantizer's :meth:`quantize` made and a code store
        kept apart (the KV cache's per-channel-group fields, norms in float16), to decode or score as
        returned."""
        given = {name for name, t in (("qjl_signs", qjl_signs), ("residual_norms", residual_norms)) if t is not None}
        if given != set(self._side_fields):
            raise ValueError(f"{self.signature} stores codes, norms and {list(self._side_fields) or 'nothing more'}"
                             f", got {sorted(given) or 'codes and norms alone'}")
        return QuantizedVectors(codes=codes, norms=norms, qjl_signs=qjl_signs, residual_norms=residual_norms,
                                dim=self.dim, bits=self.bits, mse_bits=self.mse_bits, signature=self.signature,
                                dtype=dtype)

    def _validated(self, x: torch.Tensor, name: str = "x", finite: bool = True) -> torch.Tensor:
        """``x`` checked for type, dtype and last dimension, and (``finite``) for NaN / Inf entries."""
        check_vectors(x, name, self.dim)
        return check_finite(x, name) if finite else x

    def _check_codes(self, q: QuantizedVectors) -> None:
        if not isinstance(q, QuantizedVectors):
            raise ValueError(f"expected QuantizedVectors, got {type(q).__name__}")
        if q.signature != self.signature:
            raise ValueError(f"these codes were made by {q.signature}, not by {self.signature}")

    def _split_norms(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(unit vectors (n, d) float32 on self.device, norms (n,)) of rows (n, d); zero vectors stay zero.
        float64 rows are normalised in float64 (their norms stay float64 for :func:`_check_norms`)."""
        rows = rows.to(self.device)
        unit, norms = unit_vectors(rows if rows.dtype == torch.float64 else rows.float())
        return unit.float(), norms

    @torch.no_grad()
    def dequantize(self, q: QuantizedVectors) -> torch.Tensor:
        """x̃ = ‖x‖ · u, shape (…, d), in the input's dtype, with u the unit vector's reconstruction
        (:meth:`_unit_rows`: Alg. 1's, Definition 1's or Alg. 2's), chunk by chunk."""
        self._check_codes(q)
        flat = q.flatten()
        out = torch.empty(len(flat.norms), self.dim, dtype=torch.float32, device=self.device)
        for part in self._chunks(out.shape[0]):
            out[part] = self._unit_rows(flat, part) * flat.norms[part].float().unsqueeze(-1)
        return out.reshape(*q.shape, self.dim).to(q.dtype)

    def _unit_rows(self, flat: QuantizedVectors, part: slice) -> torch.Tensor:
        """The reconstruction (len(part), d) float32 of rows ``part`` of ``flat`` as unit vectors."""
        raise NotImplementedError

    def _chunks(self, n: int):
        for start in range(0, n, self.chunk_size):
            yield slice(start, min(start + self.chunk_size, n))

    def _encode(self, rows: torch.Tensor) -> Fields:
        """The fields of rows (n, d) by the configured backend (default: the torch reference)."""
        return self._encode_torch(rows)

    def _encode_torch(self, rows: torch.Tensor) -> Fields:
        raise NotImplementedError

    def _redo_extreme_rows(self, rows: torch.Tensor, fields: Fields) -> None:
        """Re-encode, with the torch reference, the rows whose norm lies outside ``SAFE_NORMS`` (zero, tiny, huge
        or non-finite: the Triton and numba encoders square in float32), and check their norms; one device
        synchronisation when there are none. Inside a CUDA-graph capture, where the host cannot branch on the
        device, the test is recorded on the device instead, for :meth:`check_captured_rows` after the replays."""
        norms = fields["norms"]
        extreme = ~((norms > SAFE_NORMS[0]) & (norms < SAFE_NORMS[1]))
        if _capturing():
            if self._captured_extreme is None:
                raise RuntimeError(f"{self.signature}: quantize once outside the CUDA-graph capture first (warm-up)")
            self._captured_extreme.logical_or_(extreme.any())
            return
        if self._captured_extreme is None:  # a capture's record is allocated outside it (one bool per quantizer)
            self._captured_extreme = torch.zeros((), dtype=torch.bool, device=norms.device)
        if not bool(extreme.any()):
            return
        index = extreme.nonzero().squeeze(1)
        redone = self._encode_torch(rows[index.to(rows.device)])
        _check_norms(redone["norms"])
        for name, values in redone.items():
            fields[name][index] = values.to(fields[name].dtype)

    def check_captured_rows(self) -> None:
        """After the replays of a captured CUDA graph that quantizes with this quantizer: ValueError when a replay met
        a row whose norm lies outside ``SAFE_NORMS`` (outside graphs such rows are re-encoded by the reference;
        inside one their codes are the kernel's, unchecked); one synchronisation. Clears the record."""
        if self._captured_extreme is not None and bool(self._captured_extreme):
            self._captured_extreme.zero_()
            raise ValueError(f"{self.signature}: a replayed CUDA graph quantized a vector whose norm lies outside "
                             f"{SAFE_NORMS} (zero, tiny, huge or not finite); its codes were not re-encoded")

    @torch.no_grad()
    def quantize(self, x: torch.Tensor) -> QuantizedVectors:
        """Quantize x (…, d): packed codes, float32 norms and (QJL, TurboQuant_prod) sign bits."""
        x = self._validated(x, finite=False)  # finiteness: through the norms, with no extra pass over x
        lead = x.shape[:-1]
        rows = x.reshape(-1, self.dim)
        fields = self._encode(rows)
        self._redo_extreme_rows(rows, fields)

        def shaped(name: str) -> torch.Tensor | None:
            tensor = fields.get(name)
            return None if tensor is None else tensor.reshape(*lead, *tensor.shape[1:])
        return QuantizedVectors(codes=shaped("codes"), norms=shaped("norms").to(_NORM_DTYPE),
                                qjl_signs=shaped("qjl_signs"),
                                residual_norms=None if "residual_norms" not in fields
                                else shaped("residual_norms").to(_NORM_DTYPE),
                                dim=self.dim, bits=self.bits, mse_bits=self.mse_bits, signature=self.signature,
                                dtype=x.dtype)

    def _queries(self, y: torch.Tensor) -> torch.Tensor:
        y = self._validated(y, "y")
        if y.ndim > 2:
            raise ValueError(f"y must be (m, {self.dim}) or ({self.dim},), got shape {tuple(y.shape)}")
        return y.reshape(-1, self.dim).to(device=self.device, dtype=torch.float32)

    @staticmethod
    def _scores_shape(y: torch.Tensor, q: QuantizedVectors, scores: torch.Tensor) -> torch.Tensor:
        lead = (scores.shape[0],) if y.ndim == 2 else ()
        return scores.reshape(*lead, *q.shape)

    @torch.no_grad()
    def inner_product(self, y: torch.Tensor, q: QuantizedVectors) -> torch.Tensor:
        """Estimates of ⟨y, x⟩ for every stored x, from :meth:`score_stages` (:meth:`_stage_scores`): shape
        (m, *q.shape) for y (m, d), q.shape for y (d,)."""
        queries = self._queries(y)
        self._check_codes(q)
        return self._scores_shape(y, q, self._stage_scores(queries, q.flatten()))

    def score_stages(self) -> tuple[ScoreStage, ...]:
        """The terms of this quantizer's inner-product estimate (:class:`ScoreStage`)."""
        raise NotImplementedError

    def _stage_scores(self, queries: torch.Tensor, flat: QuantizedVectors) -> torch.Tensor:
        """(m, n) float32 ‖x‖ · Σ_s scale_s · w_s · ⟨T_s y, c_s[codes_s]⟩, each query transformed once per stage:
        on the Triton path one scores-kernel launch per stage with the row weight ‖x‖ · w_s, else in torch, the
        stored codes decoded chunk by chunk."""
        stages = self.score_stages()
        transformed = [stage.query_transform(queries) for stage in stages]
        if self._triton:
            from .kernels import mse_scores_triton

            unit = None
            for stage, query in zip(stages, transformed):
                weights = flat.norms if stage.row_weight is None else \
                    flat.norms.float() * getattr(flat, stage.row_weight).float()
                term = mse_scores_triton(query[None], getattr(flat, stage.codes)[None], weights[None],
                                         stage.centroids, stage.bits, stage.scale)[0]
                unit = term if unit is None else unit + term
            return unit
        scores = torch.empty(queries.shape[0], len(flat.norms), dtype=torch.float32, device=self.device)
        for part in self._chunks(scores.shape[1]):
            unit = None
            for stage, query in zip(stages, transformed):
                codes = unpack_codes(getattr(flat, stage.codes)[part], stage.bits, self.dim)
                term = query @ stage.centroids[codes.long()].T
                if stage.scale != 1.0:
                    term = stage.scale * term
                if stage.row_weight is not None:
                    term = term * getattr(flat, stage.row_weight)[part].float()
                unit = term if unit is None else unit + term
            scores[:, part] = unit * flat.norms[part].float()
        return scores


class TurboQuantMSE(_VectorQuantizer):
    """TurboQuant_mse (paper, Algorithm 1): rotate, then quantize each coordinate with Lloyd-Max.

    D_mse = E‖x − x̃‖² of a unit vector equals ``self.codebook.mse`` (for the Haar rotation) and obeys
    4^(−b) ≤ D_mse ≤ √3·π/2 · 4^(−b) (Theorems 1 and 3).

    Args:
        dim: d ≥ 2.  bits: b in [1, 8].
        rotation: ``"haar"`` (the paper's Π) or ``"hadamard"`` (fast substitute).
        seed: seeds Π.  density: codebook density, ``"exact"`` (f_d) or ``"gaussian"`` (N(0, 1/d)).
        device: where codes, codebook and rotation live.  chunk_size: vectors processed at a time.
        backend: ``"auto"`` (Triton kernels on CUDA, the numba CPU encoder on the CPU when numba is
            installed, torch otherwise), ``"torch"`` (the exact reference), ``"triton"`` or ``"numba"``.
        threads: numba threads for the CPU encoder (default: ``torch.get_num_threads()``).
    """

    def __init__(self, dim: int, bits: int, rotation: str = "haar", seed: int = 0,
                 device: torch.device | str | None = None, density: str = "exact",
                 chunk_size: int = _DEFAULT_CHUNK, backend: str = "auto", threads: int | None = None):
        self._configure(dim, seed, device, chunk_size)
        self.bits = self.mse_bits = check_int(bits, "TurboQuantMSE bits", 1, MAX_BITS)
        self.density = check_choice(density, "density", SUPPORTED_DENSITIES)
        self.codebook: Codebook = lloyd_max_codebook(self.dim, self.bits, density)
        self.rotation: Rotation = make_rotation(rotation, self.dim, self.seed, self.device)
        self._centroids = self.codebook.centroids_tensor(self.device)
        self._boundaries = self.codebook.boundaries_tensor(self.device)
        self.backend = backend
        self.backend_choice = quantizer_backend(backend, self.device, mse_bits=self.bits, dim=self.dim)
        self.threads = _check_threads(threads)

    @property
    def signature(self) -> str:
        return (f"TurboQuantMSE(dim={self.dim}, bits={self.bits}, rotation={self.rotation.kind}, "
                f"seed={self.seed}, density={self.density})")

    # -- the two halves of Algorithm 1, on unit vectors (n, d) -------------------------------------
    def encode_unit(self, unit: torch.Tensor) -> torch.Tensor:
        """Indices (n, d) uint8 of the nearest centroid of each rotated coordinate (Alg. 1, lines 4-5)."""
        rotated = self.rotation.apply(unit)
        return torch.bucketize(rotated, self._boundaries).to(torch.uint8)

    def centroid_values(self, indices: torch.Tensor) -> torch.Tensor:
        """ỹ = c[idx] (n, d) float32: the reconstruction in the rotated basis."""
        return self._centroids[indices.long()]

    def decode_unit(self, indices: torch.Tensor) -> torch.Tensor:
        """x̃ = Πᵀ c[idx] (Alg. 1, lines 8-9) for unit-norm inputs."""
        return self.rotation.inverse(self.centroid_values(indices))

    # -- public API --------------------------------------------------------------------------------
    def _encode(self, rows: torch.Tensor) -> Fields:
        if self._triton and rows.dtype != torch.float64:
            from .kernels import quantize_mse_triton

            codes, norms = quantize_mse_triton(rows.to(self.device), self.rotation.matrix(),
                                               self.codebook.boundaries, self.bits, norms_dtype=_NORM_DTYPE)
        elif self._numba_for(rows):
            from .kernels.quantize_cpu import quantize_mse_cpu

            codes, norms = quantize_mse_cpu(rows, self.rotation, self.codebook.boundaries, self.bits,
                                            self.chunk_size, self.threads)
        else:
            return self._encode_torch(rows)
        return {"codes": codes, "norms": norms}

    def _encode_torch(self, rows: torch.Tensor) -> Fields:
        unit, norms = self._split_norms(rows)
        codes = torch.empty(unit.shape[0], packed_size(self.dim, self.bits), dtype=torch.uint8, device=self.device)
        for part in self._chunks(unit.shape[0]):
            codes[part] = pack_codes(self.encode_unit(unit[part]), self.bits, check_range=False)
        return {"codes": codes, "norms": norms}

    def unpack(self, q: QuantizedVectors) -> torch.Tensor:
        """The centroid indices (…, d) uint8 of stored codes."""
        self._check_codes(q)
        return unpack_codes(q.codes, self.bits, self.dim)

    def _unit_rows(self, flat: QuantizedVectors, part: slice) -> torch.Tensor:
        """Πᵀ c[idx] of rows ``part``."""
        return self.decode_unit(unpack_codes(flat.codes[part], self.bits, self.dim))

    def score_stages(self) -> tuple[ScoreStage, ...]:
        """One stage: ⟨y, x̃⟩ = ‖x‖ · ⟨Πy, c[idx]⟩ (Π orthogonal)."""
        return (ScoreStage("codes", self.bits, self._centroids, self.rotation.apply),)


class QJL(_VectorQuantizer):
    """The 1-bit Quantized Johnson-Lindenstrauss map (paper, Definition 1).

    Q(x) = sign(Sx), Q⁻¹(z) = √(π/2)/d · Sᵀz. For unit x, E⟨y, Q⁻¹(Q(x))⟩ = ⟨y, x⟩ and the variance is at
    most π/(2d) · ‖y‖² (Lemma 4). The norm ‖x‖ is stored so any x is handled.
    """

    _side_fields = ("qjl_signs",)

    def __init__(self, dim: int, seed: int = 0, device: torch.device | str | None = None,
                 chunk_size: int = _DEFAULT_CHUNK):
        self._configure(dim, seed, device, chunk_size)
        self.bits = 1
        self.mse_bits = 0
        self.backend_choice = Choice("quantizer backend", "torch", (("triton", "QJL alone has no kernel"),
                                                                    ("numba", "QJL alone has no kernel")))
        generator = stream_generator(self.seed, "qjl", self.dim)
        self.matrix = torch.randn(self.dim, self.dim, generator=generator).to(self.device)  # S
        self.scale = math.sqrt(math.pi / 2) / self.dim
        self._sign_values = torch.tensor([-1.0, 1.0], device=self.device)  # sign bit 0 / 1 (sign_bits)

    @property
    def signature(self) -> str:
        return f"QJL(dim={self.dim}, seed={self.seed})"

    def sign_bits(self, vectors: torch.Tensor) -> torch.Tensor:
        """Packed bits of sign(S v) for v (n, d): bit 1 for ≥ 0 (+1), bit 0 for −1."""
        return pack_codes((vectors @ self.matrix.T >= 0).to(torch.uint8), 1, check_range=False)

    def signs(self, packed: torch.Tensor) -> torch.Tensor:
        """±1 float32 (n, d) from packed sign bits: the QJL stage's two-entry codebook (:meth:`score_stages`)."""
        return self._sign_values[unpack_codes(packed, 1, self.dim).long()]

    def sketch(self, queries: torch.Tensor) -> torch.Tensor:
        """S y for queries (m, d): scores against sign vectors z are then ⟨Sy, z⟩ = ⟨y, Sᵀz⟩."""
        return queries @ self.matrix.T

    def _encode_torch(self, rows: torch.Tensor) -> Fields:
        unit, norms = self._split_norms(rows)
        signs = torch.empty(unit.shape[0], packed_size(self.dim, 1), dtype=torch.uint8, device=self.device)
        for part in self._chunks(unit.shape[0]):
            signs[part] = self.sign_bits(unit[part])
        empty = torch.empty(unit.shape[0], 0, dtype=torch.uint8, device=self.device)
        return {"codes": empty, "norms": norms, "qjl_signs": signs}

    def _unit_rows(self, flat: QuantizedVectors, part: slice) -> torch.Tensor:
        """√(π/2)/d · Sᵀ z of rows ``part`` (Definition 1)."""
        return self.scale * (self.signs(flat.qjl_signs[part]) @ self.matrix)

    def score_stages(self) -> tuple[ScoreStage, ...]:
        """One stage: ⟨y, x̃⟩ = ‖x‖ · √(π/2)/d · ⟨Sy, z⟩, the sign bits as 1-bit codes of (−1, +1)."""
        return (ScoreStage("qjl_signs", 1, self._sign_values, self.sketch, scale=self.scale),)


class TurboQuantProd(_VectorQuantizer):
    """TurboQuant_prod (paper, Algorithm 2): (b−1)-bit TurboQuant_mse plus 1-bit QJL on the residual.

    Unbiased: E⟨y, x̃⟩ = ⟨y, x⟩, with D_prod ≤ √3·π²·‖y‖²/d · 4^(−b) (Theorem 2). At b = 1 the MSE stage
    has no bits, x̃_mse = 0 and this is QJL alone. Π and S are drawn from independent seeds.
    """

    _side_fields = ("qjl_signs", "residual_norms")

    def __init__(self, dim: int, bits: int, rotation: str = "haar", seed: int = 0,
                 device: torch.device | str | None = None, density: str = "exact",
                 chunk_size: int = _DEFAULT_CHUNK, backend: str = "auto"):
        self._configure(dim, seed, device, chunk_size)
        self.bits = check_int(bits, "TurboQuantProd bits", 1, MAX_BITS)
        self.mse_bits = self.bits - 1
        self.rotation_kind = check_choice(rotation, "rotation", ROTATION_KINDS)
        self.density = check_choice(density, "density", SUPPORTED_DENSITIES)
        self.backend = backend
        self.backend_choice = quantizer_backend(backend, self.device, mse_bits=self.mse_bits, dim=self.dim,
                                                prod=True)
        self.mse = (TurboQuantMSE(self.dim, self.mse_bits, rotation, self.seed, self.device, density, chunk_size,
                                  "triton" if self._triton else "torch")
                    if self.mse_bits else None)
        self.qjl = QJL(self.dim, self.seed, self.device, chunk_size)  # S's stream is not Π's (turboquant._random)
        self._sketch_rotated: torch.Tensor | None = None  # S Πᵀ, built on the numba path's first use

    @property
    def rotation(self) -> Rotation | None:
        return self.mse.rotation if self.mse else None

    @property
    def codebook(self) -> Codebook | None:
        return self.mse.codebook if self.mse else None

    @property
    def signature(self) -> str:
        return (f"TurboQuantProd(dim={self.dim}, bits={self.bits}, rotation={self.rotation_kind}, "
                f"seed={self.seed}, density={self.density})")

    def _encode(self, rows: torch.Tensor) -> Fields:
        if self._triton and rows.dtype != torch.float64:
            from .kernels import quantize_prod_triton

            mse_stage = ((self.mse.rotation.matrix(), self.codebook.boundaries, self.mse._centroids)
                         if self.mse else (None, None, None))
            codes, signs, norms, residual_norms = quantize_prod_triton(
                rows.to(self.device), *mse_stage, self.mse_bits, self.qjl.matrix, norms_dtype=_NORM_DTYPE)
        elif self._numba_for(rows):
            from .kernels.quantize_cpu import quantize_prod_cpu

            if self._sketch_rotated is None:
                self._sketch_rotated = self.mse.rotation.apply(self.qjl.matrix)  # rows Π s_i: S Πᵀ
            codes, signs, norms, residual_norms = quantize_prod_cpu(
                rows, self.mse.rotation, self.codebook.boundaries, self.mse._centroids, self.mse_bits,
                self._sketch_rotated, self.chunk_size)
        else:
            return self._encode_torch(rows)
        return {"codes": codes, "qjl_signs": signs, "norms": norms, "residual_norms": residual_norms}

    def _encode_torch(self, rows: torch.Tensor) -> Fields:
        """The exact reference path: codes, QJL sign bits, norms and residual norms of ``rows``."""
        unit, norms = self._split_norms(rows)
        n = unit.shape[0]
        codes = torch.empty(n, packed_size(self.dim, self.mse_bits) if self.mse else 0, dtype=torch.uint8,
                            device=self.device)
        signs = torch.empty(n, packed_size(self.dim, 1), dtype=torch.uint8, device=self.device)
        residual_norms = torch.empty(n, dtype=torch.float32, device=self.device)
        for part in self._chunks(n):
            residual = unit[part]
            if self.mse:
                indices = self.mse.encode_unit(residual)
                codes[part] = pack_codes(indices, self.mse_bits, check_range=False)
                residual = residual - self.mse.decode_unit(indices)
            residual_norms[part] = torch.linalg.vector_norm(residual, dim=-1)
            signs[part] = self.qjl.sign_bits(residual)
        return {"codes": codes, "qjl_signs": signs, "norms": norms, "residual_norms": residual_norms}

    def _unit_rows(self, flat: QuantizedVectors, part: slice) -> torch.Tensor:
        """Πᵀc[idx] + √(π/2)/d · ‖r‖ · Sᵀ sign(Sr) of rows ``part`` (Alg. 2, DeQuant_prod)."""
        unit = self.qjl._unit_rows(flat, part) * flat.residual_norms[part].float().unsqueeze(-1)
        return unit + self.mse._unit_rows(flat, part) if self.mse else unit

    def score_stages(self) -> tuple[ScoreStage, ...]:
        """The MSE stage, then QJL of the residual: ⟨y, x̃⟩ = ‖x‖ · (⟨Πy, c[idx]⟩ + √(π/2)/d · ‖r‖ · ⟨Sy, sign(Sr)⟩)."""
        qjl = replace(self.qjl.score_stages()[0], row_weight="residual_norms",
                      mean_row_weight=math.sqrt(self.mse.codebook.mse) if self.mse else 1.0)
        return (*self.mse.score_stages(), qjl) if self.mse else (qjl,)
