"""KIVI (Liu et al., ICML 2024, arXiv 2402.02750): asymmetric integer quantization, keys per channel, values per token.

The paper's scheme, as its Algorithm 1 and reference code do it:

- asymmetric min-max quantization of a group ``g``: ``z = min(g)``, ``s = (max(g) - min(g)) / (2^b - 1)``,
  ``code = round((x - z) / s)`` in ``[0, 2^b - 1]``, ``x_hat = code * s + z``; ``s`` and ``z`` kept in fp16;
- **keys per channel**: a group is one channel over ``G`` consecutive tokens (outliers live in fixed key
  channels, so per-channel ranges are tight). Because a group spans tokens, keys are quantized in blocks: new
  keys wait in a 16-bit residual until it holds ``R`` tokens (``R`` a multiple of ``G``), then the block is
  quantized; the prefill quantizes its first ``n - n mod R`` tokens;
- **values per token**: a group is ``G`` consecutive channels of one token; the ``R`` most recent values stay
  in 16 bits (a sliding window), older ones are quantized one token at a time as they leave it;
- the paper's settings are ``G = 32``, ``R = 128`` (its LongBench runs), 2 or 4 bits; TurboQuant's Table 1
  uses KIVI at 3 and 5 bits.

Codes are bit-packed per token over the ``d`` channels (``ceil(d*b/8)`` bytes; KIVI packs into int32 words,
which wastes 2 bits per word at 3 and 5 bits; we count the tighter bit stream).

Bytes of one layer (``B`` batch, ``H`` KV heads, ``d`` head dim; ``n_kq``/``n_vq`` quantized and
``n_kr``/``n_vr`` residual key/value tokens; fp16 scale + zero = 4 bytes per group)::

    nbytes = B*H*[ (n_kq + n_vq) * ceil(d*b/8) + 4*d*n_kq/G + 4*(d/G)*n_vq + 2*d*(n_kr + n_vr) ]

so the steady-state cost is ``b + 32/G`` bits per value (``b + 1`` at ``G = 32``).
"""

from __future__ import annotations

import math

import torch

import turboquant as tq
from turboquant.kvcache.base import CompressedCache, peak_ratio_over
from turboquant.kvcache.factory import ModelShape, register_method
from turboquant.kvcache.stream import (
    Encoder,
    Fields,
    QuantizedStream,
    StreamLayer,
    quantized_and_residual,
)

SCALE_BYTES = 2  # fp16 scale and fp16 zero point per group


def asymmetric_quantize(groups: torch.Tensor, bits: int, dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Min-max quantize ``groups`` along ``dim``: returns uint8 codes, fp16 scale and fp16 zero (``dim`` kept as 1)."""
    levels = 2**bits - 1
    zero = groups.amin(dim=dim, keepdim=True).to(torch.float16)
    scale = ((groups.amax(dim=dim, keepdim=True) - zero.float()) / levels).to(torch.float16)
    safe_scale = torch.where(scale > 0, scale.float(), torch.ones_like(scale, dtype=torch.float32))
    codes = torch.round((groups - zero.float()) / safe_scale).clamp_(0, levels).to(torch.uint8)
    return codes, scale, zero


class KIVIEncoder(Encoder):
    """Asymmetric ``bits``-bit quantization over groups of ``group_size`` entries: along tokens
    (``along="tokens"``, KIVI's keys: per channel, over blocks of consecutive tokens, so chunks are whole blocks) or
    along channels (``along="channels"``, KIVI's values: per token, over groups of consecutive channels)."""

    def __init__(self, bits: int, group_size: int, dim: int, along: str) -> None:
        if along not in ("tokens", "channels"):
            raise ValueError(f"along must be 'tokens' or 'channels', got {along!r}")
        self.bits, self.group_size, self.dim, self.along = bits, group_size, dim, along

    def _groups(self, batch: int, heads: int, tokens: int) -> tuple[tuple[int, ...], int]:
        """The shape that puts each group on its own axis, and that axis."""
        g = self.group_size
        if self.along == "channels":
            return (batch, heads, tokens, self.dim // g, g), 4
        if tokens % g:
            raise ValueError(f"KIVI key blocks must be whole groups of {g} tokens, got {tokens}")
        return (batch, heads, tokens // g, g, self.dim), 3

    def encode(self, x: torch.Tensor) -> Fields:
        shape, axis = self._groups(*x.shape[:3])
        codes, scale, zero = asymmetric_quantize(x.reshape(shape), self.bits, dim=axis)
        packed = tq.pack_codes(codes.reshape(x.shape), self.bits, check_range=False)  # clamped to [0, 2^b)
        return {"codes": packed, "scale": scale.squeeze(axis), "zero": zero.squeeze(axis)}

    def decode(self, fields: Fields) -> torch.Tensor:
        codes = tq.unpack_codes(fields["codes"], self.bits, self.dim).float()
        shape, axis = self._groups(*codes.shape[:3])
        out = codes.reshape(shape) * fields["scale"].float().unsqueeze(axis) + fields["zero"].float().unsqueeze(axis)
        return out.reshape(codes.shape)


class KIVILayer(StreamLayer):
    """One layer of KIVI; see the module docstring for the scheme and the byte formula."""

    def __init__(
        self,
        layer_idx: int,
        bits: int,
        group_size: int = 32,
        residual_length: int = 128,
        fp_dtype: torch.dtype | None = None,
        keep_workspace: bool = True,
    ) -> None:
        super().__init__(layer_idx, fp_dtype)
        self.bits, self.group_size, self.residual_length = bits, group_size, residual_length
        self.keep_workspace = keep_workspace

    def _initialize(self) -> None:
        if self.head_dim % self.group_size:
            raise ValueError(f"KIVI group_size {self.group_size} must divide head_dim {self.head_dim}")
        common = {"fp_dtype": self.fp_dtype, "compute_dtype": self.compute_dtype, "keep_workspace": self.keep_workspace}
        self.key_stream = QuantizedStream(
            KIVIEncoder(self.bits, self.group_size, self.head_dim, "tokens"), self.residual_length, "block", **common
        )
        self.value_stream = QuantizedStream(
            KIVIEncoder(self.bits, self.group_size, self.head_dim, "channels"), self.residual_length, "sliding",
            **common
        )

    def expected_nbytes(self) -> int:
        if not self.is_initialized:
            return 0
        counts = (self.key_stream.quantized_tokens, self.key_stream.residual_tokens,
                  self.value_stream.quantized_tokens, self.value_stream.residual_tokens)
        per_head = kivi_nbytes_per_head(self.head_dim, self.bits, self.group_size, *counts)
        return self.batch_size * self.num_heads * per_head


def kivi_nbytes_per_head(d: int, bits: int, group_size: int, n_kq: int, n_kr: int, n_vq: int, n_vr: int) -> int:
    """The module docstring's byte formula for one layer, batch row and KV head."""
    return (
        (n_kq + n_vq) * math.ceil(d * bits / 8)
        + 2 * SCALE_BYTES * d * n_kq // group_size
        + 2 * SCALE_BYTES * (d // group_size) * n_vq
        + 2 * d * (n_kr + n_vr)
    )


def kivi_memory_ratio(d: int, bits: int, group_size: int, residual_length: int, tokens: int | None) -> float:
    """Ratio to the 16-bit cache after ``tokens`` tokens (``None``: steady state, residual excluded)."""
    if tokens is None:
        return kivi_bits_per_value(bits, group_size) / 16
    n_kq, n_kr = quantized_and_residual(tokens, residual_length, "block")
    n_vq, n_vr = quantized_and_residual(tokens, residual_length, "sliding")
    return kivi_nbytes_per_head(d, bits, group_size, n_kq, n_kr, n_vq, n_vr) / (2 * 2 * d * tokens)


def kivi_bits_per_value(bits: int, group_size: int) -> float:
    """Steady-state stored bits per value, residual excluded: ``b + 2*16/G``."""
    return bits + 2 * 8 * SCALE_BYTES / group_size


def kivi_bits_for_memory_ratio(memory_ratio: float, d: int, group_size: int, residual_length: int,
                               tokens: int | None, max_new_tokens: int | None = None) -> int:
    """Largest bit width whose ratio is at most ``memory_ratio`` at its peak over ``tokens .. tokens +
    max_new_tokens`` (or in the steady state when ``tokens`` is None)."""
    def ratio(bits: int) -> float:
        return peak_ratio_over(lambda t: kivi_memory_ratio(d, bits, group_size, residual_length, t), tokens,
                               max_new_tokens)

    fitting = [b for b in range(1, 9) if ratio(b) <= memory_ratio + 1e-9]
    if not fitting:
        raise ValueError(f"no KIVI bit width fits memory_ratio={memory_ratio} (group_size={group_size}, "
                         f"residual_length={residual_length}, context_length={tokens})")
    return max(fitting)


def build_kivi_cache(
    shape: ModelShape,
    bits: int | None = None,
    group_size: int = 32,
    residual_length: int = 128,
    memory_ratio: float | None = None,
    context_length: int | None = None,
    max_new_tokens: int | None = None,
    fp_dtype: torch.dtype | None = None,
    keep_workspace: bool = True,
) -> CompressedCache:
    """KIVI at ``bits`` (1..8; the paper's 2/4, TurboQuant's table 3/5) or at the largest bits fitting
    ``memory_ratio`` — at its peak over a generation of ``max_new_tokens`` after a ``context_length``-token prompt
    (residual windows counted) if the length is given, else in the steady state."""
    if (bits is None) == (memory_ratio is None):
        raise ValueError("give exactly one of bits= or memory_ratio= for KIVI")
    if group_size <= 0 or residual_length <= 0 or residual_length % group_size:
        raise ValueError(
            f"KIVI needs group_size > 0 and residual_length a positive multiple of it, got {group_size}, {residual_length}"
        )
    if shape.head_dim % group_size:
        raise ValueError(f"KIVI group_size {group_size} must divide head_dim {shape.head_dim}")
    if bits is None:
        bits = kivi_bits_for_memory_ratio(memory_ratio, shape.head_dim, group_size, residual_length, context_length,
                                          max_new_tokens)
    if not isinstance(bits, int) or not 1 <= bits <= 8:
        raise ValueError(f"KIVI bits must be an integer in 1..8, got {bits!r}")
    layers = [
        KIVILayer(index, bits, group_size, residual_length, fp_dtype=fp_dtype, keep_workspace=keep_workspace)
        for index in range(shape.num_layers)
    ]
    options = {"bits": bits, "group_size": group_size, "residual_length": residual_length,
               "nominal_bits_per_value": kivi_bits_per_value(bits, group_size)}
    return CompressedCache(layers, method="kivi", options=options)


register_method("kivi", build_kivi_cache)
