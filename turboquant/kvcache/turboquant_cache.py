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
blocks of ``R``, so the last ``< R`` stay in fp16, as in the authors' code), ``boundary_layers`` (the first and
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

Bytes of one quantized layer (``B`` batch, ``H`` KV heads, ``n_q`` quantized and ``n_r`` fp16 tokens; a stream
with channel groups ``m_j`` at ``b_j`` bits)::

    token_bytes(stream) = sum_j [ ceil(m_j * b_j / 8) + 2 ]                                   (mse)
                        = sum_j [ ceil(m_j * (b_j - 1) / 8) + ceil(m_j / 8) + 2 + 2 ]           (prod: + QJL signs, residual norm)
    nbytes = B*H*[ n_q * (token_bytes(K) + token_bytes(V)) + 2 * 2*d*n_r + index_bytes + center_bytes ]
    index_bytes = (k_K + k_V) * (1 if d <= 256 else 2)      (outlier channel indices, 0 without a split)
    center_bytes = 2*d if center_keys else 0                  (the fp16 key mean mu)

``value_outliers=False`` splits the keys only (values at ``value_bits`` throughout), which is what the
authors' supplementary code does (2.5-bit keys with 32 outlier channels, 2-bit values).

Boundary layers cost ``2*B*H*n*d*2`` bytes like the full cache.

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

import torch

import turboquant as tq
from turboquant.kvcache.base import CompressedCache, tensor_nbytes
from turboquant.kvcache.factory import ModelShape, register_method
from turboquant.kvcache.full import FullPrecisionLayer
from turboquant.kvcache.stream import (
    Encoder,
    Fields,
    QuantizedStream,
    StreamLayer,
    quantized_and_residual,
)

KEY_VARIANTS = ("mse", "prod")
ROTATIONS = ("haar", "hadamard")
NORM_BYTES = 2  # fp16


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
    boundary_layers: int = 0
    rotation: str = "haar"
    seed: int = 0
    center_keys: bool = False

    def __post_init__(self) -> None:
        if self.key_variant not in KEY_VARIANTS:
            raise ValueError(f"key_variant must be one of {KEY_VARIANTS}, got {self.key_variant!r}")
        if self.rotation not in ROTATIONS:
            raise ValueError(f"rotation must be one of {ROTATIONS}, got {self.rotation!r}")
        checks = [("key_bits", self.key_bits), ("value_bits", self.value_bits)]
        if self.outlier_channels:
            checks += [("outlier_key_bits", self.outlier_key_bits_resolved),
                       ("outlier_value_bits", self.outlier_value_bits_resolved)]
        for name, value in checks:
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 8:
                raise ValueError(f"{name} must be an integer in 1..8, got {value!r}")
        if not isinstance(self.center_keys, bool):
            raise ValueError(f"center_keys must be a bool, got {self.center_keys!r}")
        if self.outlier_channels < 0 or self.residual_length < 0 or self.boundary_layers < 0:
            raise ValueError("outlier_channels, residual_length and boundary_layers must be >= 0")

    @property
    def outlier_key_bits_resolved(self) -> int:
        return self.key_bits + 1 if self.outlier_key_bits is None else self.outlier_key_bits

    @property
    def outlier_value_bits_resolved(self) -> int:
        return self.value_bits + 1 if self.outlier_value_bits is None else self.outlier_value_bits

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


def token_bytes(groups: list[tuple[int, int]], variant: str) -> int:
    """Stored bytes of one vector: packed codes + fp16 norm per group (+ QJL signs and residual norm for prod)."""
    if variant == "mse":
        return sum(math.ceil(m * b / 8) + NORM_BYTES for m, b in groups)
    return sum(math.ceil(m * (b - 1) / 8) + math.ceil(m / 8) + 2 * NORM_BYTES for m, b in groups)


def index_itemsize(head_dim: int) -> int:
    return 1 if head_dim <= 256 else 2


def nominal_bits_per_value(config: TurboQuantCacheConfig, head_dim: int) -> float:
    """True stored bits per K/V value of a quantized layer (codes + norms + indices amortised to 0; no window)."""
    key = token_bytes(config.groups(head_dim, "key"), config.key_variant)
    value = token_bytes(config.groups(head_dim, "value"), "mse")
    return 8 * (key + value) / (2 * head_dim)


def turboquant_preset(bits: float, head_dim: int) -> dict:
    """Options for ``bits`` = an integer (no split) or ``b + 0.5`` (``head_dim/4`` outlier channels at ``b+1`` bits)."""
    if float(bits).is_integer():
        return {"key_bits": int(bits), "value_bits": int(bits)}
    if (2 * bits).is_integer() and bits > 1:
        low = int(bits - 0.5)
        if head_dim % 4:
            raise ValueError(f"the {bits}-bit preset needs head_dim divisible by 4, got {head_dim}")
        return {"key_bits": low, "value_bits": low, "outlier_channels": head_dim // 4,
                "outlier_key_bits": low + 1, "outlier_value_bits": low + 1}
    raise ValueError(f"TurboQuant presets exist for integer bits and b + 0.5 bits (e.g. 2.5, 3.5), got {bits}")


def _make_quantizer(dim: int, bits: int, variant: str, rotation: str, seed: int, device: torch.device):
    cls = tq.TurboQuantProd if variant == "prod" else tq.TurboQuantMSE
    return cls(dim, bits, rotation=rotation, seed=seed, device=device)


class TurboQuantEncoder(Encoder):
    """One stream (keys or values) of one layer: optional centering (keys), optional outlier split, one
    TurboQuant instance per channel group."""

    def __init__(self, head_dim: int, groups: list[tuple[int, int]], variant: str, rotation: str, seed: int,
                 device: torch.device, center: bool = False) -> None:
        self.head_dim, self.variant, self.center = head_dim, variant, center
        self.key_mean: torch.Tensor | None = None  # stored when centering: (B, H, d) fp16 mean of the prefill
        self.quantizers = [
            _make_quantizer(m, b, variant, rotation, seed + part, device) for part, (m, b) in enumerate(groups)
        ]
        self.outlier_channels = groups[0][0] if len(groups) == 2 else 0
        self.outlier_index: torch.Tensor | None = None  # stored: (B, H, k) uint8/int16
        self.permutation: torch.Tensor | None = None  # derived: (B, H, d) outliers first, then the rest
        self.templates: list[tq.QuantizedVectors | None] = [None] * len(groups)

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
        fields: Fields = {}
        for part, (quantizer, piece) in enumerate(zip(self.quantizers, self._split(self._centered(x)))):
            qv = quantizer.quantize(piece.contiguous())
            if self.templates[part] is None:
                self.templates[part] = qv
            fields[f"codes{part}"] = qv.codes
            fields[f"norms{part}"] = qv.norms.to(torch.float16)
            if qv.qjl_signs is not None:
                fields[f"signs{part}"] = qv.qjl_signs
                fields[f"residual_norms{part}"] = qv.residual_norms.to(torch.float16)
        return fields

    def quantized_vectors(self, fields: Fields, part: int) -> tq.QuantizedVectors:
        """The library's QuantizedVectors of group ``part`` rebuilt from the stored fields (fp16 norms widened)."""
        changes = {"codes": fields[f"codes{part}"], "norms": fields[f"norms{part}"].float()}
        if f"signs{part}" in fields:
            changes["qjl_signs"] = fields[f"signs{part}"]
            changes["residual_norms"] = fields[f"residual_norms{part}"].float()
        return dataclasses.replace(self.templates[part], **changes)

    def decode(self, fields: Fields) -> torch.Tensor:
        pieces = [
            quantizer.dequantize(self.quantized_vectors(fields, part)).float()
            for part, quantizer in enumerate(self.quantizers)
        ]
        merged = self._merge(pieces)
        return merged if self.key_mean is None else merged + self.key_mean.float().unsqueeze(2)

    def side_nbytes(self) -> int:
        return tensor_nbytes(self.outlier_index, self.key_mean)


class TurboQuantLayer(StreamLayer):
    """One quantized layer; see the module docstring for the scheme and the byte formula."""

    def __init__(self, layer_idx: int, config: TurboQuantCacheConfig, fp_dtype: torch.dtype | None = None,
                 keep_workspace: bool = True,
                 decode_fn: Callable[[Encoder, Fields], torch.Tensor] | None = None) -> None:
        super().__init__(layer_idx, fp_dtype)
        self.config, self.keep_workspace, self.decode_fn = config, keep_workspace, decode_fn

    def _initialize(self) -> None:
        config, d = self.config, self.head_dim
        config.check_head_dim(d)
        seed = config.seed + 1000 * self.layer_idx
        streams = {}
        for offset, (stream, variant) in enumerate((("key", config.key_variant), ("value", "mse"))):
            encoder = TurboQuantEncoder(d, config.groups(d, stream), variant, config.rotation, seed + 10 * offset,
                                        self.device, center=stream == "key" and config.center_keys)
            streams[stream] = QuantizedStream(
                encoder, config.residual_length, "block", self.fp_dtype, self.compute_dtype,
                keep_workspace=self.keep_workspace, decode_fn=self.decode_fn,
            )
        self.key_stream, self.value_stream = streams["key"], streams["value"]

    def expected_nbytes(self) -> int:
        if not self.is_initialized:
            return 0
        n_q, n_r = self.key_stream.quantized_tokens, self.key_stream.residual_tokens
        return self.batch_size * self.num_heads * turboquant_nbytes_per_head(self.config, self.head_dim, n_q, n_r)


def turboquant_nbytes_per_head(config: TurboQuantCacheConfig, d: int, n_q: int, n_r: int) -> int:
    """The module docstring's byte formula for one quantized layer, batch row and KV head."""
    per_token = token_bytes(config.groups(d, "key"), config.key_variant) + token_bytes(config.groups(d, "value"), "mse")
    index_bytes = (1 + config.value_outliers) * config.outlier_channels * index_itemsize(d)
    center_bytes = NORM_BYTES * d if config.center_keys else 0
    return n_q * per_token + 2 * 2 * d * n_r + index_bytes + center_bytes


def boundary_layer_set(num_layers: int, boundary_layers: int) -> set[int]:
    """Indices of the first and last ``boundary_layers`` layers."""
    if 2 * boundary_layers >= num_layers and boundary_layers:
        raise ValueError(f"boundary_layers={boundary_layers} would keep all {num_layers} layers in full precision")
    return set(range(boundary_layers)) | set(range(num_layers - boundary_layers, num_layers))


def memory_ratio_at(config: TurboQuantCacheConfig, shape: ModelShape, tokens: int | None) -> float:
    """Model-wide ratio to the 16-bit cache after ``tokens`` tokens (boundary layers at 16 bits, windows and
    indices counted), or in the steady state (``tokens=None``: codes and norms only)."""
    full = len(boundary_layer_set(shape.num_layers, config.boundary_layers))
    if tokens is None:
        quantized = nominal_bits_per_value(config, shape.head_dim) / 16
    else:
        n_q, n_r = quantized_and_residual(tokens, config.residual_length, "block")
        quantized = turboquant_nbytes_per_head(config, shape.head_dim, n_q, n_r) / (2 * 2 * shape.head_dim * tokens)
    return (full + (shape.num_layers - full) * quantized) / shape.num_layers


PRESET_BITS = tuple(b / 2 for b in range(2, 17))  # 1, 1.5, ..., 8


def build_turboquant_cache(
    shape: ModelShape,
    bits: float | None = None,
    memory_ratio: float | None = None,
    context_length: int | None = None,
    fp_dtype: torch.dtype | None = None,
    keep_workspace: bool = True,
    decode_fn: Callable[[Encoder, Fields], torch.Tensor] | None = None,
    fused_decode: bool = False,
    **options,
) -> CompressedCache:
    """A TurboQuant cache from a preset (``bits=3.5``), a memory budget (``memory_ratio=0.25``: the largest preset
    whose true ratio fits, at ``context_length`` tokens if given — windows and indices counted — else in the
    steady state) or explicit :class:`TurboQuantCacheConfig` fields (``key_bits=...``), which override the preset's.

    ``fused_decode=True`` makes every quantized layer a
    :class:`~turboquant.kvcache.fused_attention.FusedTurboQuantLayer`: inside
    ``fused_decode(model, cache)`` its decode steps are answered by the Triton kernel reading the packed codes,
    and no decoded workspace is kept (a configuration the kernel cannot serve raises ``ValueError`` with the
    reason from ``fused_decode_unsupported``). It is an option of this method rather than a method of its own
    (``"turboquant_fused"``) because it changes how attention *reads* the store, not what is stored: the codes,
    the bytes, the byte formula and the method name in result rows are the same, as for ``keep_workspace`` and
    ``decode_fn``, the other two read paths (``decode_fn`` is the workspace path's hook and cannot be combined
    with it)."""
    if bits is not None and memory_ratio is not None:
        raise ValueError("give bits= or memory_ratio=, not both")
    if not isinstance(fused_decode, bool):
        raise ValueError(f"fused_decode must be a bool, got {fused_decode!r}")
    if fused_decode and decode_fn is not None:
        raise ValueError("decode_fn is the workspace path's decode hook; with fused_decode=True attention reads "
                         "the packed fields in the kernel, so give one or the other")
    unknown = set(options) - {f.name for f in dataclasses.fields(TurboQuantCacheConfig)}
    if unknown:
        raise ValueError(f"unknown TurboQuant options {sorted(unknown)}")
    if memory_ratio is not None:
        fitting = [
            b for b in PRESET_BITS
            if memory_ratio_at(TurboQuantCacheConfig(**{**turboquant_preset(b, shape.head_dim), **options}), shape,
                                context_length) <= memory_ratio + 1e-9
        ]
        if not fitting:
            raise ValueError(f"no TurboQuant preset fits memory_ratio={memory_ratio}")
        bits = max(fitting)
    preset = turboquant_preset(bits, shape.head_dim) if bits is not None else {}
    config = TurboQuantCacheConfig(**{**preset, **options})
    config.check_head_dim(shape.head_dim)
    full = boundary_layer_set(shape.num_layers, config.boundary_layers)
    if fused_decode:
        # deferred: fused_attention builds on this module (FusedTurboQuantLayer subclasses TurboQuantLayer)
        from turboquant.kvcache.fused_attention import (
            FusedTurboQuantLayer,
            fused_decode_unsupported,
        )

        reason = fused_decode_unsupported(config)
        if reason is not None:
            raise ValueError(f"fused_decode=True cannot serve this TurboQuant configuration: {reason}")

        def quantized_layer(index: int) -> TurboQuantLayer:
            return FusedTurboQuantLayer(index, config, fp_dtype, keep_workspace=keep_workspace)
    else:
        def quantized_layer(index: int) -> TurboQuantLayer:
            return TurboQuantLayer(index, config, fp_dtype, keep_workspace=keep_workspace, decode_fn=decode_fn)
    layers = [FullPrecisionLayer(i, fp_dtype) if i in full else quantized_layer(i) for i in range(shape.num_layers)]
    summary = {**dataclasses.asdict(config), "preset_bits": bits,
               "nominal_bits_per_value": nominal_bits_per_value(config, shape.head_dim), "fused_decode": fused_decode}
    return CompressedCache(layers, method="turboquant", options=summary)


register_method("turboquant", build_turboquant_cache)
