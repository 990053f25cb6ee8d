"""TurboQuantCache: keys and values quantized online with TurboQuant (arXiv 2504.19874, Algorithms 1 and 2).

Every key and value vector (one token, one KV head, ``d`` channels) is quantized as it is written — the
prefill and every generated token — and stored bit-packed with its norm:

- keys with ``TurboQuant_mse`` (Algorithm 1; the authors' KV code) or ``TurboQuant_prod`` (Algorithm 2:
  ``(b-1)``-bit MSE + 1-bit QJL of the residual, unbiased inner products); ``key_variant="mse"|"prod"``;
- values with ``TurboQuant_mse`` (values enter attention through a weighted sum, where MSE is the objective);
- norms are stored in fp16 (the paper's byte count), codes as a little-endian bit stream per vector.

Fractional bits (the paper's "2.5" and "3.5"; §4.3 / Table 1). Per layer, KV head and batch row, the
``outlier_channels`` channels with the largest L2 norm over the prefill are split off, and the two channel
groups are quantized by two independent TurboQuant instances (their own rotation and codebook), outliers at
``outlier_*_bits`` (default: one more bit). Each group stores its own fp16 norm, and the outlier channel
indices are stored once per (layer, batch row, KV head, stream). The presets :func:`turboquant_preset`:

- ``bits = b + 0.5``: ``d/4`` outlier channels at ``b + 1`` bits, the rest at ``b`` bits, keys and values;
  with ``d = 128`` (32 of 128 channels, the paper's example) the codes cost ``b + 0.25`` bits and the two fp16
  norms ``32/128 = 0.25`` bit: exactly ``b + 0.5`` bits per value — the paper's 2.5 is really 2.25 bits of
  codes plus norms (see the erratum in the reference notes). With ``d = 64`` (SmolLM2, Qwen 0.5B: 16 of 64
  channels) the same split costs ``b + 0.75`` bits; :func:`nominal_bits_per_value` reports the true figure;
- integer ``bits``: no split, ``b + 16/d`` bits per value.

Options also include a 16-bit window of recent tokens (``residual_length = R``: tokens are quantized in
blocks of ``R``, so the last ``< R`` stay in fp16, as in the authors' code), ``sink_tokens`` (the first that
many tokens of the sequence kept in fp16 for good: attention sinks, StreamingLLM), ``boundary_layers`` (the first and
last that many layers kept in fp16, vLLM's "boundary layers"), ``rotation`` (``haar`` = the paper's Π,
``hadamard`` = the fast randomized Hadamard substitute) and ``seed``.

Key centering (``center_keys=True``, an extension, not in the paper). TurboQuant's error on a vector scales
with its norm (Theorem 1: ``E||x - x~||^2 = D_mse * ||x||^2``), and real keys share a large component across
tokens (a ``k_proj`` bias, as in Qwen2.5; outlier channels). Attention is blind to such a component: for a
query ``q`` and any vector ``mu``, ``softmax_j(q . k_j) = softmax_j(q . (k_j - mu))`` because ``q . mu`` shifts
every logit of that query equally. So per layer, batch row and KV head the cache stores ``mu`` = the mean of
the prefill's keys (fp16), quantizes ``k - mu`` for every key written (prefill and later tokens alike, same
``mu``), and adds ``mu`` back when reading — the attention weights see the error of ``k - mu`` only. The outlier
channels are chosen on the centered keys. Values are never centered (their weighted sum is not shift-invariant).
The cache sees keys after the rotary embedding, which turns a constant pre-RoPE offset ``b`` into ``R_j b`` at
position ``j``: only its slowly rotating (low-frequency) channel pairs stay common to all tokens, so ``mu``
removes a bias there and averages it out elsewhere.

Bytes of one quantized layer (``B`` batch, ``H`` KV heads, ``n_q`` quantized and ``n_r`` fp16 tokens, window
and sink tokens together; a stream with channel groups ``m_j`` at ``b_j`` bits)::

    token_bytes(stream) = sum_j [ ceil(m_j * b_j / 8) + 2 ]                                   (mse)
                        = sum_j [ ceil(m_j * (b_j - 1) / 8) + ceil(m_j / 8) + 2 + 2 ]           (prod: + QJL signs, residual norm)
    nbytes = B*H*[ n_q * (token_bytes(K) + token_bytes(V)) + 2 * 2*d*n_r + index_bytes + center_bytes ]
    index_bytes = (k_K + k_V) * (1 if d <= 256 else 2)      (outlier channel indices, 0 without a split)
    center_bytes = 2*d if center_keys else 0                  (the fp16 key mean mu)

``value_outliers=False`` splits the keys only (values at ``value_bits`` throughout), which is what the
authors' supplementary code does (2.5-bit keys with 32 outlier channels, 2-bit values).

Boundary layers (and any layer listed in ``fp16_layers``) cost ``2*B*H*n*d*2`` bytes like the full cache.

Other stream formats (vLLM's TurboQuant presets, :data:`VLLM_PRESETS`). ``key_format="fp8"`` stores each key
coordinate as one FP8 e4m3 byte (clamped to its +-448 range; no rotation, no norm: ``d`` bytes per key);
``value_format="uniform"`` quantizes each value vector with asymmetric min-max codes over its ``d`` channels
(KIVI's per-token scheme with one group: fp16 scale and zero, ``ceil(d*b/8) + 4`` bytes). ``norm_correction``
(vLLM's ``_nc``): the stored norm of a TurboQuant_mse vector is ``||x|| / ||c(idx)||``, where ``c(idx)`` is the
reconstruction of the unit vector in the rotated domain, so the decoded vector has the input's norm exactly
(vLLM divides by ``||c(idx)||`` when decoding; dividing when encoding gives the same decoded vector from the same
bytes, and the decode kernel reads it unchanged). It removes the norm shrinkage of ``E||c||^2 = 1 - D_mse``
(Theorem 1) at the cost of the bias it introduces in inner products.

Attention on CPU reads the keys back through the library's torch dequantization (``TurboQuantMSE.dequantize``
/ ``TurboQuantProd.dequantize``); ``decode_fn`` is the hook for a fused CUDA decode (``turboquant.kernels``),
called as ``decode_fn(encoder, fields)`` on the packed fields of a chunk (see :mod:`turboquant.kvcache.stream`);
with ``center_keys`` it must add ``encoder.key_mean`` back (as ``decode`` does): attention also sees the
current tokens' keys as computed, so only keys with ``mu`` restored share one offset with them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

import turboquant as tq
from turboquant.backends import Choice, KernelStream, check_fused_decode, decode_read_path
from turboquant.kvcache.base import CompressedCache, peak_ratio_over, tensor_nbytes
from turboquant.kvcache.factory import ModelShape, register_method
from turboquant.kvcache.full import FullPrecisionLayer
from turboquant.kvcache.fused_attention import DecodeStep, cache_format, decode_step_attention, hides_tokens
from turboquant.kvcache.kivi import KIVIEncoder
from turboquant.kvcache.stream import (
    Encoder,
    Fields,
    QuantizedStream,
    StreamLayer,
    quantized_and_residual,
)

if TYPE_CHECKING:  # the kernel module imports Triton: at run time only where a kernel runs
    from turboquant.kernels.decode_attention import CacheFormat

KEY_VARIANTS = ("mse", "prod")
ROTATIONS = ("haar", "hadamard")
KEY_FORMATS = ("turboquant", "fp8")
VALUE_FORMATS = ("turboquant", "uniform")
NORM_BYTES = 2  # fp16
UNIFORM_SIDE_BYTES = 4  # fp16 scale + fp16 zero point of a uniformly quantized value vector
FP8_MAX = 448.0  # largest finite float8_e4m3fn

#: vLLM's TurboQuant KV-cache presets (``--kv-cache-dtype``; vllm/model_executor/layers/quantization/turboquant/
#: config.py): FP8 or Lloyd-Max keys, uniform values, norm correction, the first and last 2 layers in 16 bits.
#: vLLM rotates keys with a plain Hadamard matrix; here the rotation is the package's (``rotation`` option).
VLLM_PRESETS: dict[str, dict] = {
    "turboquant_k8v4": {"key_format": "fp8", "key_bits": 8, "value_format": "uniform", "value_bits": 4,
                        "boundary_layers": 2},
    "turboquant_4bit_nc": {"key_bits": 4, "value_format": "uniform", "value_bits": 4, "norm_correction": True,
                           "boundary_layers": 2},
    "turboquant_k3v4_nc": {"key_bits": 3, "value_format": "uniform", "value_bits": 4, "norm_correction": True,
                           "boundary_layers": 2},
    "turboquant_3bit_nc": {"key_bits": 3, "value_format": "uniform", "value_bits": 3, "norm_correction": True,
                           "boundary_layers": 2},
}


@dataclass(frozen=True)
class TurboQuantCacheConfig:
    """All options of a TurboQuant KV cache (validated on construction)."""

    key_bits: int = 4
    value_bits: int = 4
    key_variant: str = "mse"
    outlier_channels: int = 0
    outlier_key_bits: int | None = None
    outlier_value_bits: int | None = None
    value_outliers: bool = True
    residual_length: int = 0
    sink_tokens: int = 0
    boundary_layers: int = 0
    rotation: str = "haar"
    seed: int = 0
    center_keys: bool = False
    key_format: str = "turboquant"
    value_format: str = "turboquant"
    norm_correction: bool = False
    fp16_layers: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.key_variant not in KEY_VARIANTS:
            raise ValueError(f"key_variant must be one of {KEY_VARIANTS}, got {self.key_variant!r}")
        if self.rotation not in ROTATIONS:
            raise ValueError(f"rotation must be one of {ROTATIONS}, got {self.rotation!r}")
        if self.key_format not in KEY_FORMATS:
            raise ValueError(f"key_format must be one of {KEY_FORMATS}, got {self.key_format!r}")
        if self.value_format not in VALUE_FORMATS:
            raise ValueError(f"value_format must be one of {VALUE_FORMATS}, got {self.value_format!r}")
        if self.key_format == "fp8" and (self.key_bits != 8 or self.key_variant != "mse" or self.center_keys):
            raise ValueError("key_format='fp8' stores 8-bit keys as they are: needs key_bits=8, key_variant='mse' "
                             "and center_keys=False")
        if not isinstance(self.norm_correction, bool):
            raise ValueError(f"norm_correction must be a bool, got {self.norm_correction!r}")
        if self.norm_correction and self.key_variant == "prod":
            raise ValueError("norm_correction rescales TurboQuant_mse reconstructions; it is not defined for "
                             "key_variant='prod' (whose QJL stage is unbiased without it)")
        if self.outlier_channels and (self.key_format != "turboquant" or
                                      (self.value_outliers and self.value_format != "turboquant")):
            raise ValueError("the outlier channel split applies to TurboQuant-format streams only: use "
                             "key_format/value_format='turboquant' (or value_outliers=False)")
        object.__setattr__(self, "fp16_layers", tuple(int(i) for i in self.fp16_layers))
        checks = [("key_bits", self.key_bits), ("value_bits", self.value_bits)]
        if self.outlier_channels:
            checks += [("outlier_key_bits", self.outlier_key_bits_resolved),
                       ("outlier_value_bits", self.outlier_value_bits_resolved)]
        for name, value in checks:
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 8:
                raise ValueError(f"{name} must be an integer in 1..8, got {value!r}")
        if not isinstance(self.center_keys, bool):
            raise ValueError(f"center_keys must be a bool, got {self.center_keys!r}")
        if min(self.outlier_channels, self.residual_length, self.sink_tokens, self.boundary_layers) < 0:
            raise ValueError("outlier_channels, residual_length, sink_tokens and boundary_layers must be >= 0")

    @property
    def outlier_key_bits_resolved(self) -> int:
        return self.key_bits + 1 if self.outlier_key_bits is None else self.outlier_key_bits

    @property
    def outlier_value_bits_resolved(self) -> int:
        return self.value_bits + 1 if self.outlier_value_bits is None else self.outlier_value_bits

    def kernel_streams(self) -> list[KernelStream]:
        """The stored streams as the decode kernel would read them (:func:`turboquant.backends.decode_read_path`)."""
        qjl = self.key_variant == "prod"
        streams = [KernelStream("key", self.key_format, self.key_bits, qjl),
                   KernelStream("value", self.value_format, self.value_bits)]
        if self.outlier_channels:
            streams.append(KernelStream("outlier_key", self.key_format, self.outlier_key_bits_resolved, qjl))
            if self.value_outliers:
                streams.append(KernelStream("outlier_value", self.value_format, self.outlier_value_bits_resolved))
        return streams

    def read_path(self, fused_decode: bool | str = "auto", device: torch.device | str | None = None) -> Choice:
        """Which read path serves decode attention over this configuration's layers (on ``device``, when given),
        and why the other does not: :func:`turboquant.backends.decode_read_path`."""
        return decode_read_path(fused_decode, device, self.kernel_streams())

    def check_head_dim(self, head_dim: int) -> None:
        if self.outlier_channels >= head_dim:
            raise ValueError(f"outlier_channels ({self.outlier_channels}) must be smaller than head_dim ({head_dim})")

    def groups(self, head_dim: int, stream: str) -> list[tuple[int, int]]:
        """``(channels, bits)`` of each channel group of ``stream`` ("key"/"value"), outliers first."""
        bits = self.key_bits if stream == "key" else self.value_bits
        if self.outlier_channels == 0 or (stream == "value" and not self.value_outliers):
            return [(head_dim, bits)]
        high = self.outlier_key_bits_resolved if stream == "key" else self.outlier_value_bits_resolved
        return [(self.outlier_channels, high), (head_dim - self.outlier_channels, bits)]

    def stream_bytes(self, head_dim: int, stream: str) -> int:
        """Stored bytes of one key or value vector in this configuration's format."""
        if stream == "key" and self.key_format == "fp8":
            return head_dim
        if stream == "value" and self.value_format == "uniform":
            return math.ceil(head_dim * self.value_bits / 8) + UNIFORM_SIDE_BYTES
        return token_bytes(self.groups(head_dim, stream), self.key_variant if stream == "key" else "mse")


def token_bytes(groups: list[tuple[int, int]], variant: str) -> int:
    """Stored bytes of one TurboQuant vector: packed codes + fp16 norm per group (+ QJL signs and residual norm
    for prod)."""
    if variant == "mse":
        return sum(math.ceil(m * b / 8) + NORM_BYTES for m, b in groups)
    return sum(math.ceil(m * (b - 1) / 8) + math.ceil(m / 8) + 2 * NORM_BYTES for m, b in groups)


def index_itemsize(head_dim: int) -> int:
    return 1 if head_dim <= 256 else 2


def nominal_bits_per_value(config: TurboQuantCacheConfig, head_dim: int) -> float:
    """True stored bits per K/V value of a quantized layer (codes + norms + indices amortised to 0; no window)."""
    return 8 * (config.stream_bytes(head_dim, "key") + config.stream_bytes(head_dim, "value")) / (2 * head_dim)


def vllm_preset_options(name: str) -> dict:
    """The options of one of vLLM's TurboQuant presets (:data:`VLLM_PRESETS`)."""
    if name not in VLLM_PRESETS:
        raise ValueError(f"unknown vLLM TurboQuant preset {name!r}; known: {sorted(VLLM_PRESETS)}")
    return dict(VLLM_PRESETS[name])


def _stream_preset(bits: float, head_dim: int) -> tuple[int, int | None]:
    """``(bits of the regular channels, bits of the outlier channels or None)`` of one stream's preset."""
    if isinstance(bits, bool) or not isinstance(bits, (int, float)):
        raise ValueError(f"TurboQuant preset bits must be numbers, got {bits!r}")
    if float(bits).is_integer():
        return int(bits), None
    if (2 * bits).is_integer() and bits > 1:
        if head_dim % 4:
            raise ValueError(f"the {bits}-bit preset needs head_dim divisible by 4, got {head_dim}")
        return int(bits - 0.5), int(bits + 0.5)
    raise ValueError(f"TurboQuant presets exist for integer bits and b + 0.5 bits (e.g. 2.5, 3.5), got {bits}")


def turboquant_preset(bits: float | tuple[float, float] | list[float], head_dim: int) -> dict:
    """Options for ``bits`` = an integer (no split) or ``b + 0.5`` (``head_dim/4`` outlier channels at ``b+1``
    bits), for keys and values alike, or a pair ``(key bits, value bits)`` of such presets (e.g. ``(3.5, 2.5)``:
    both streams split the same ``head_dim/4`` channels; an integer side keeps its bits in both groups)."""
    key, value = (bits, bits) if not isinstance(bits, (tuple, list)) else tuple(bits)
    (key_low, key_high), (value_low, value_high) = _stream_preset(key, head_dim), _stream_preset(value, head_dim)
    options = {"key_bits": key_low, "value_bits": value_low}
    if key_high is not None or value_high is not None:
        options.update(outlier_channels=head_dim // 4, outlier_key_bits=key_high or key_low,
                       outlier_value_bits=value_high or value_low)
    return options


def _make_quantizer(dim: int, bits: int, variant: str, rotation: str, seed: int, device: torch.device):
    cls = tq.TurboQuantProd if variant == "prod" else tq.TurboQuantMSE
    return cls(dim, bits, rotation=rotation, seed=seed, device=device)


class TurboQuantEncoder(Encoder):
    """One stream (keys or values) of one layer: optional centering (keys), optional outlier split, one
    TurboQuant instance per channel group."""

    def __init__(self, head_dim: int, groups: list[tuple[int, int]], variant: str, rotation: str, seed: int,
                 device: torch.device, center: bool = False, norm_correction: bool = False) -> None:
        self.head_dim, self.variant, self.center, self.norm_correction = head_dim, variant, center, norm_correction
        self.key_mean: torch.Tensor | None = None  # stored when centering: (B, H, d) fp16 mean of the prefill
        self.quantizers = [
            _make_quantizer(m, b, variant, rotation, seed + part, device) for part, (m, b) in enumerate(groups)
        ]
        self.outlier_channels = groups[0][0] if len(groups) == 2 else 0
        self.outlier_index: torch.Tensor | None = None  # stored: (B, H, k) uint8/int16
        self.permutation: torch.Tensor | None = None  # derived: (B, H, d) outliers first, then the rest

    def prepare(self, prefill: torch.Tensor) -> None:
        """Per batch row and KV head: the mean ``mu`` of the prefill tokens (when centering), then the outlier
        channels: top-k by L2 norm over the (centered) prefill tokens."""
        if self.center:
            self.key_mean = prefill.mean(dim=2).to(torch.float16)
            prefill = self._centered(prefill)
        if not self.outlier_channels:
            return
        channel_norms = prefill.pow(2).sum(dim=2)  # (B, H, d)
        outliers = channel_norms.topk(self.outlier_channels, dim=-1).indices.sort(dim=-1).values
        is_outlier = torch.zeros_like(channel_norms, dtype=torch.bool).scatter_(-1, outliers, True)
        rest = torch.argsort(is_outlier.to(torch.int8), dim=-1, stable=True)[..., : self.head_dim - self.outlier_channels]
        self.permutation = torch.cat([outliers, rest], dim=-1)
        dtype = torch.uint8 if index_itemsize(self.head_dim) == 1 else torch.int16
        self.outlier_index = outliers.to(dtype)

    def _centered(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.key_mean is None else x - self.key_mean.float().unsqueeze(2)

    def _split(self, x: torch.Tensor) -> list[torch.Tensor]:
        if not self.outlier_channels:
            return [x]
        index = self.permutation.unsqueeze(2).expand(-1, -1, x.shape[2], -1)
        permuted = x.gather(-1, index)
        return [permuted[..., : self.outlier_channels], permuted[..., self.outlier_channels:]]

    def _merge(self, pieces: list[torch.Tensor]) -> torch.Tensor:
        if not self.outlier_channels:
            return pieces[0]
        permuted = torch.cat(pieces, dim=-1)
        index = self.permutation.unsqueeze(2).expand(-1, -1, permuted.shape[2], -1)
        return torch.empty_like(permuted).scatter_(-1, index, permuted)

    def encode(self, x: torch.Tensor) -> Fields:
        """The packed fields of channel group ``g``: ``codes{g}``, ``norms{g}`` (fp16) and, with a QJL stage,
        ``qjl_signs{g}`` and ``residual_norms{g}`` (fp16), the :class:`~turboquant.QuantizedVectors` fields."""
        fields: Fields = {}
        for part, (quantizer, piece) in enumerate(zip(self.quantizers, self._split(self._centered(x)))):
            qv = quantizer.quantize(piece.contiguous())
            fields[f"codes{part}"] = qv.codes
            norms = qv.norms
            if self.norm_correction:  # ||x|| / ||c(idx)||: ||dequantize|| = ||x|| * ||c(idx)|| (Pi is orthogonal)
                reconstructed = quantizer.dequantize(qv).float().norm(dim=-1)
                norms = torch.where(reconstructed > 0, norms * norms / reconstructed.clamp_min(1e-30), norms)
            fields[f"norms{part}"] = norms.to(torch.float16)
            if qv.qjl_signs is not None:
                fields[f"qjl_signs{part}"] = qv.qjl_signs
                fields[f"residual_norms{part}"] = qv.residual_norms.to(torch.float16)
        return fields

    def group_vectors(self, fields: Fields) -> list[tq.QuantizedVectors]:
        """The stored fields as one :class:`~turboquant.QuantizedVectors` per channel group (fp16 norms kept):
        what the quantizers decode and the decode kernel reads."""
        return [quantizer.stored(fields[f"codes{part}"], fields[f"norms{part}"], fields.get(f"qjl_signs{part}"),
                                 fields.get(f"residual_norms{part}"))
                for part, quantizer in enumerate(self.quantizers)]

    def decode(self, fields: Fields) -> torch.Tensor:
        pieces = [quantizer.dequantize(qv).float()
                  for quantizer, qv in zip(self.quantizers, self.group_vectors(fields))]
        merged = self._merge(pieces)
        return merged if self.key_mean is None else merged + self.key_mean.float().unsqueeze(2)

    def side_nbytes(self) -> int:
        return tensor_nbytes(self.outlier_index, self.key_mean)


class FP8Encoder(Encoder):
    """Each coordinate as one float8_e4m3fn byte, clamped to +-448 (vLLM's ``k8`` keys: no rotation, no scale)."""

    def encode(self, x: torch.Tensor) -> Fields:
        return {"fp8": x.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)}

    def decode(self, fields: Fields) -> torch.Tensor:
        return fields["fp8"].float()


def _stream_encoder(config: TurboQuantCacheConfig, stream: str, head_dim: int, seed: int,
                    device: torch.device) -> Encoder:
    """The encoder of one stream ("key"/"value") in the configuration's format."""
    if stream == "key" and config.key_format == "fp8":
        return FP8Encoder()
    if stream == "value" and config.value_format == "uniform":
        return KIVIEncoder(config.value_bits, group_size=head_dim, dim=head_dim, along="channels")  # one group / vector
    variant = config.key_variant if stream == "key" else "mse"
    return TurboQuantEncoder(head_dim, config.groups(head_dim, stream), variant, config.rotation, seed, device,
                             center=stream == "key" and config.center_keys, norm_correction=config.norm_correction)


class TurboQuantLayer(StreamLayer):
    """One quantized layer; see the module docstring for the scheme and the byte formula.

    The read path is chosen once, at construction: the decoded workspace (``keep_workspace``, ``decode_fn``;
    the model's attention reads what :meth:`update` returns) or, with ``fused_decode=True``, decode steps read the
    packed codes through the Triton kernel inside ``attach(model, cache)`` (:mod:`turboquant.kvcache.fused_attention`;
    no workspace is kept where the kernel runs, decided at the first update by the device). ``capacity`` (fused only,
    no window, no sink tokens) makes the store static, allocated once for that many tokens and written at a token count
    held on the device, so that a decode step can be captured in a CUDA graph and replayed
    (:class:`~turboquant.kvcache.base.StaticTokenBuffer`; :meth:`after_graph_replays`).
    """

    AWAITING = "the packed part of a fused decode step"

    def __init__(self, layer_idx: int, config: TurboQuantCacheConfig, fp_dtype: torch.dtype | None = None,
                 keep_workspace: bool = True,
                 decode_fn: Callable[[Encoder, Fields], torch.Tensor] | None = None,
                 fused_decode: bool = False, capacity: int | None = None) -> None:
        super().__init__(layer_idx, fp_dtype)
        if capacity is not None and not fused_decode:
            raise ValueError("a static store (capacity=) is read by the fused decode kernel: give fused_decode=True")
        if fused_decode and decode_fn is not None:
            raise ValueError("decode_fn is the workspace path's decode hook; with fused_decode=True attention reads "
                             "the packed fields in the kernel, so give one or the other")
        if fused_decode:
            config.read_path(True)  # ValueError with the reason when the kernel cannot read this configuration
        self.config, self.keep_workspace, self.decode_fn = config, keep_workspace, decode_fn
        self.fused_decode, self.capacity = fused_decode, capacity
        self.fused = False  # set at the first update: fused_decode and the kernel runs on the device
        self._format: CacheFormat | None = None  # the kernel's constants, built at the first fused step
        self._masked_in_graph: torch.Tensor | None = None  # static store: a captured step's mask hid a token

    def _initialize(self) -> None:
        config, d = self.config, self.head_dim
        config.check_head_dim(d)
        choice = config.read_path("auto", self.device)
        self.fused = self.fused_decode and choice.chosen == "fused"
        if self.capacity is not None and not self.fused:
            raise ValueError(f"a static store (capacity=) is read by the fused decode kernel, which does not serve "
                             f"here: {choice}")
        self.keep_workspace = self.keep_workspace and not self.fused
        seed = config.seed + 1000 * self.layer_idx
        streams = {}
        for offset, stream in enumerate(("key", "value")):
            encoder = _stream_encoder(config, stream, d, seed + 10 * offset, self.device)
            streams[stream] = QuantizedStream(
                encoder, config.residual_length, "block", self.fp_dtype, self.compute_dtype,
                keep_workspace=self.keep_workspace, decode_fn=self.decode_fn, sink_length=config.sink_tokens,
                capacity=self.capacity,
            )
        self.key_stream, self.value_stream = streams["key"], streams["value"]

    @property
    def read_path(self) -> str:
        return "fused" if self.fused else "workspace"

    def expected_nbytes(self) -> int:
        if not self.is_initialized:
            return 0
        n_q = self.key_stream.quantized_tokens
        n_r = self.key_stream.residual_tokens + self.key_stream.sink_tokens
        return self.batch_size * self.num_heads * turboquant_nbytes_per_head(self.config, self.head_dim, n_q, n_r)

    # ------------------------------------------------------------------ the fused read path
    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Fused decode steps inside ``attach``: write the token, return only the exact part (sink tokens, window,
        new token) and leave the packed part to :meth:`attend`; anything else: the workspace update."""
        if self.awaiting is not None:
            raise RuntimeError(self.detach())
        self.check_states(key_states, value_states)
        if not self._defers(key_states.shape[-2]):
            return super().update(key_states, value_states, *args, **kwargs)
        keys, values = self.key_stream, self.value_stream
        batch = key_states.shape[0]
        (key_fields, seq_lens), (value_fields, _) = keys.packed_view(batch), values.packed_view(batch)
        step = DecodeStep(key_fields, value_fields, keys.quantized_tokens, seq_lens, _exact(keys, key_states),
                          _exact(values, value_states), keys.sink_tokens)
        self._write(key_states, value_states)
        self.seen_tokens += 1
        self.awaiting = step
        return step.exact_keys, step.exact_values

    def _defers(self, query_length: int) -> bool:
        """Whether a step of ``query_length`` tokens is a fused decode step (its packed part read by the kernel)."""
        return (self.is_initialized and self.fused and self.attached and query_length == 1
                and self.stored_tokens() > 0)

    def _counts_on_device(self) -> bool:
        """Inside a CUDA-graph capture over a static store: the lengths a captured step derives must be the store's
        count on the device (a 0-dim tensor, as transformers' ``StaticLayer`` returns), which every replay's write
        advances; a host int would freeze the capture-time length into the graph."""
        return self.capacity is not None and self.is_initialized and tq.quantizers._capturing()

    def get_seq_length(self) -> int | torch.Tensor:
        """Tokens seen (the positions); in a capture over a static store, the device count (:meth:`_counts_on_device`)."""
        return self.key_stream.device_tokens() if self._counts_on_device() else super().get_seq_length()

    def get_query_offset(self) -> int | torch.Tensor:
        """Tokens stored (the causal mask's query row); in a capture over a static store, the device count
        (:meth:`_counts_on_device`), else every replay's mask would end at the capture-time token."""
        return self.key_stream.device_tokens() if self._counts_on_device() else super().get_query_offset()

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """A static store's decode step is masked over the whole capacity, as transformers' ``StaticLayer`` is, so
        that a mask built inside a captured graph covers every later replay (:meth:`_check_static_mask`)."""
        if self.capacity is not None and self._defers(query_length):
            return self.capacity, 0
        return super().get_mask_sizes(query_length)

    def _check_static_mask(self, attention_mask: torch.Tensor | None, step: DecodeStep) -> None:
        """A static store serves unpadded batches (its kernel has no per-token mask, and its step tests nothing on
        the host): ValueError when ``attention_mask`` hides a stored token or the new one. Inside a CUDA-graph
        capture the test is recorded on the device and raised by :meth:`after_graph_replays`; the record is
        allocated by the first step outside a capture (the warm-up)."""
        capturing = tq.quantizers._capturing()
        if self._masked_in_graph is None:
            if capturing:
                raise RuntimeError(f"layer {self.layer_idx}: run one decode step outside the CUDA-graph capture "
                                   "first (warm-up)")
            self._masked_in_graph = torch.zeros((), dtype=torch.bool, device=step.exact_keys.device)
        if attention_mask is None:
            return
        allowed = attention_mask[:, 0, -1]  # (B, kv positions): bool, or additive (0 or very negative)
        allowed = allowed if allowed.dtype == torch.bool else allowed >= 0
        live = torch.arange(allowed.shape[-1], device=allowed.device) <= step.seq_lens[:, None]  # stored + new
        hidden = (live & ~allowed).any()
        if capturing:
            self._masked_in_graph.logical_or_(hidden)
        elif bool(hidden):
            raise ValueError(f"layer {self.layer_idx}: a static store serves unpadded batches (its kernel has no "
                             "per-token mask), but this decode step's attention mask hides a stored token")

    def attend(self, module, query, key, value, attention_mask, attention, **kwargs):
        """A pending decode step: the kernel over the packed store merged with the exact part (or, when the mask
        hides cached tokens, the model's attention over the decoded store); anything else: the model's attention."""
        step, self.awaiting = self.awaiting, None
        if step is None:
            return attention(module, query, key, value, attention_mask, **kwargs)
        if self.capacity is not None:
            self._check_static_mask(attention_mask, step)
        elif hides_tokens(attention_mask):  # padded rows: the kernel has no per-token mask
            keys, values = self._full_past(step)
            return attention(module, query, keys, values, attention_mask, **kwargs)
        scaling = kwargs.get("scaling")
        scale = query.shape[-1] ** -0.5 if scaling is None else scaling
        if self._format is None and step.quantized:
            self._format = cache_format(self.key_stream.encoder, self.value_stream.encoder, query.device)
        out = decode_step_attention(query, step, self.key_stream.encoder, self.value_stream.encoder, self._format,
                                    scale)
        return out.to(query.dtype)[:, None], None  # (B, 1, heads, d), as the model's reshape expects

    def after_graph_replays(self) -> None:
        """After replays of a captured decode step over a static store: the host's token counts read back from the
        device, so that lengths and bytes are reported right again; then ValueError if a replay quantized a row the
        kernels cannot encode (``check_captured_rows``) or ran under a mask that hid a stored token
        (:meth:`_check_static_mask`). A few synchronisations; each record is cleared once reported."""
        if not (self.is_initialized and self.capacity is not None):
            return
        for stream in (self.key_stream, self.value_stream):
            stream.resync()
        self.seen_tokens = self.key_stream.tokens
        if self._masked_in_graph is not None and bool(self._masked_in_graph):
            self._masked_in_graph.zero_()
            raise ValueError(f"layer {self.layer_idx}: a replayed CUDA graph's decode step ran under an attention mask "
                             "that hid a stored token; a static store serves unpadded batches, so the step attended "
                             "to it")
        for stream in (self.key_stream, self.value_stream):
            for quantizer in getattr(stream.encoder, "quantizers", ()):
                quantizer.check_captured_rows()

    def _full_past(self, step: DecodeStep) -> tuple[torch.Tensor, torch.Tensor]:
        """Sink tokens, decoded packed part, window and new token, oldest first (the torch path when the kernel
        cannot serve a step)."""
        if step.quantized == 0:
            return step.exact_keys, step.exact_values
        s = step.sink_tokens
        keys = self.key_stream.encoder.decode(step.key_fields).to(step.exact_keys.dtype)
        values = self.value_stream.encoder.decode(step.value_fields).to(step.exact_values.dtype)
        return (torch.cat([step.exact_keys[:, :, :s], keys, step.exact_keys[:, :, s:]], dim=-2),
                torch.cat([step.exact_values[:, :, :s], values, step.exact_values[:, :, s:]], dim=-2))


def _exact(stream: QuantizedStream, new: torch.Tensor) -> torch.Tensor:
    """The stream's 16-bit sink tokens and window, then the new token (what a fused step attends to exactly)."""
    parts = [part.to(new.dtype) for part in (stream.sink, stream.residual) if part is not None and part.shape[-2]]
    return torch.cat([*parts, new], dim=-2) if parts else new


def turboquant_nbytes_per_head(config: TurboQuantCacheConfig, d: int, n_q: int, n_r: int) -> int:
    """The module docstring's byte formula for one quantized layer, batch row and KV head."""
    per_token = config.stream_bytes(d, "key") + config.stream_bytes(d, "value")
    index_bytes = (1 + config.value_outliers) * config.outlier_channels * index_itemsize(d)
    center_bytes = NORM_BYTES * d if config.center_keys else 0
    return n_q * per_token + 2 * 2 * d * n_r + index_bytes + center_bytes


def full_precision_layers(config: TurboQuantCacheConfig, num_layers: int) -> set[int]:
    """Indices of the layers kept in 16 bits: the first and last ``boundary_layers`` and ``fp16_layers`` (layer
    indices; negative ones count from the last layer, as in Python: -1 is the last)."""
    boundary = config.boundary_layers
    outside = [i for i in config.fp16_layers if not -num_layers <= i < num_layers]
    if outside:
        raise ValueError(f"fp16_layers {outside} do not exist in a model of {num_layers} layers")
    layers = set(range(boundary)) | set(range(num_layers - boundary, num_layers)) if boundary else set()
    layers |= {i % num_layers for i in config.fp16_layers}
    if len(layers) >= num_layers:
        raise ValueError(f"boundary_layers={boundary} and fp16_layers={list(config.fp16_layers)} would keep all "
                         f"{num_layers} layers in full precision")
    return layers


def memory_ratio_at(config: TurboQuantCacheConfig, shape: ModelShape, tokens: int | None) -> float:
    """Model-wide ratio to the 16-bit cache after ``tokens`` tokens (boundary layers at 16 bits, windows and
    indices counted), or in the steady state (``tokens=None``: codes and norms only)."""
    full = len(full_precision_layers(config, shape.num_layers))
    if tokens is None:
        quantized = nominal_bits_per_value(config, shape.head_dim) / 16
    else:
        n_q, n_r = quantized_and_residual(tokens, config.residual_length, "block", config.sink_tokens)
        quantized = turboquant_nbytes_per_head(config, shape.head_dim, n_q, n_r) / (2 * 2 * shape.head_dim * tokens)
    return (full + (shape.num_layers - full) * quantized) / shape.num_layers


PRESET_BITS = tuple(b / 2 for b in range(2, 17))  # 1, 1.5, ..., 8


def build_turboquant_cache(
    shape: ModelShape,
    bits: float | tuple[float, float] | list[float] | None = None,
    memory_ratio: float | None = None,
    context_length: int | None = None,
    max_new_tokens: int | None = None,
    vllm_preset: str | None = None,
    fp_dtype: torch.dtype | None = None,
    keep_workspace: bool = True,
    decode_fn: Callable[[Encoder, Fields], torch.Tensor] | None = None,
    fused_decode: bool | str = False,
    capacity: int | None = None,
    **options,
) -> CompressedCache:
    """A TurboQuant cache from a preset (``bits=3.5``, ``bits=(3.5, 2.5)`` for keys and values, or one of vLLM's, ``vllm_preset="turboquant_4bit_nc"``), a
    memory budget (``memory_ratio=0.25``: the largest ``bits`` preset whose true ratio fits at its peak over a
    generation of ``max_new_tokens`` after a ``context_length``-token prompt — windows and indices counted — or in
    the steady state without a length) or explicit :class:`TurboQuantCacheConfig` fields (``key_bits=...``), which
    override the preset's.

    ``fused_decode`` chooses the read path of the quantized layers once (:class:`TurboQuantLayer`): ``True``
    answers decode steps inside ``attach(model, cache)`` by the Triton kernel reading the packed codes, with no
    decoded workspace (a configuration the kernel cannot serve raises ``ValueError`` with the reason from
    ``TurboQuantCacheConfig.read_path``); ``"auto"`` does so where the kernel serves the configuration and the workspace
    elsewhere; ``False`` keeps the workspace. It is an option of this method rather than a method of its own
    because it changes how attention *reads* the store, not what is stored: the codes, the bytes, the byte
    formula and the method name in result rows are the same, as for ``keep_workspace`` and ``decode_fn``, the
    workspace path's options (``decode_fn`` cannot be combined with the fused path).

    ``capacity`` (with ``fused_decode=True``, every layer quantized, no window and no sink tokens) allocates each
    layer's store once for that many tokens, written at a count held on the device: a decode step of the model over
    this cache can then be captured in a CUDA graph (:class:`TurboQuantLayer`)."""
    if sum(x is not None for x in (bits, memory_ratio, vllm_preset)) > 1:
        raise ValueError("give at most one of bits=, memory_ratio= and vllm_preset=")
    check_fused_decode(fused_decode)
    unknown = set(options) - {f.name for f in dataclasses.fields(TurboQuantCacheConfig)}
    if unknown:
        raise ValueError(f"unknown TurboQuant options {sorted(unknown)}")
    if "fp16_layers" in options:
        options["fp16_layers"] = tuple(options["fp16_layers"])
    if memory_ratio is not None:
        def peak(config: TurboQuantCacheConfig) -> float:
            return peak_ratio_over(lambda t: memory_ratio_at(config, shape, t), context_length, max_new_tokens)

        fitting = [b for b in PRESET_BITS
                   if peak(TurboQuantCacheConfig(**{**turboquant_preset(b, shape.head_dim), **options}))
                   <= memory_ratio + 1e-9]
        if not fitting:
            raise ValueError(f"no TurboQuant preset fits memory_ratio={memory_ratio}")
        bits = max(fitting)
    if vllm_preset is not None:
        preset = vllm_preset_options(vllm_preset)
    else:
        preset = turboquant_preset(bits, shape.head_dim) if bits is not None else {}
    config = TurboQuantCacheConfig(**{**preset, **options})
    config.check_head_dim(shape.head_dim)
    full = full_precision_layers(config, shape.num_layers)
    fused = (config.read_path("auto").chosen == "fused" and decode_fn is None) if fused_decode == "auto" \
        else fused_decode

    if capacity is not None and full:
        raise ValueError(f"a static cache (capacity=) quantizes every layer; this configuration keeps layers "
                         f"{sorted(full)} in 16 bits")

    def quantized_layer(index: int) -> TurboQuantLayer:
        return TurboQuantLayer(index, config, fp_dtype, keep_workspace=keep_workspace, decode_fn=decode_fn,
                               fused_decode=fused, capacity=capacity)
    layers = [FullPrecisionLayer(i, fp_dtype) if i in full else quantized_layer(i) for i in range(shape.num_layers)]
    summary = {**dataclasses.asdict(config), "preset_bits": bits, "vllm_preset": vllm_preset,
               "nominal_bits_per_value": nominal_bits_per_value(config, shape.head_dim), "fused_decode": fused_decode}
    return CompressedCache(layers, method="turboquant", options=summary)


register_method("turboquant", build_turboquant_cache)
