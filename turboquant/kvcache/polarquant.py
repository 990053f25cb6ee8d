"""PolarQuant (Han, Kacham, Karbasi, Mirrokni, Zandieh 2025, arXiv 2502.02617): random preconditioning, then a
recursive polar transform whose angles are quantized with level-dependent bits.

Per key/value vector ``x`` (one token, one KV head, ``d`` channels):

1. *preconditioning*: ``y = S x`` with a random orthogonal ``S`` (``rotation="haar"``, or the randomized
   Hadamard substitute); the coordinates of ``y`` are then close to i.i.d. ``N(0, |x|^2/d)``;
2. *recursive polar transform* (the paper's Algorithm 1) on blocks of ``2^L`` coordinates (``L = 4``, blocks of
   16): level 1 turns each coordinate pair ``(a, b)`` into a radius ``sqrt(a^2 + b^2)`` and an angle
   ``atan2(b, a)`` in ``[0, 2*pi)``; level ``l >= 2`` pairs the radii of level ``l - 1`` the same way, giving
   angles in ``[0, pi/2]``; after ``L`` levels one radius per block remains;
3. *quantization*: the radius is kept in fp16; the angles of level ``l`` are quantized with ``b_l`` bits by a
   1-D Lloyd-Max codebook of their distribution under Gaussian inputs (Lemma 2 of the paper): uniform on
   ``[0, 2*pi)`` for level 1 and density proportional to ``sin(2*psi)^(2^(l-1) - 1)`` on ``[0, pi/2]`` for
   ``l >= 2`` (the paper's *offline* codebooks; its online k-means++ variant on the prefill is not implemented);
4. dequantization runs the transform backwards from the fp16 radius and the angle centroids, then ``S^T``.

The paper's setting (and the 3.9-bit row of TurboQuant's Table 1) is ``L = 4`` with ``b = (4, 2, 2, 2)``: per
block of 16 coordinates, ``8*4 + 4*2 + 2*2 + 1*2 = 46`` angle bits plus a 16-bit radius = 62 bits, i.e.
3.875 bits per coordinate. Keys and values are both quantized this way.

Bytes of one layer (``B`` batch, ``H`` KV heads, ``n`` tokens, ``d`` head dim; angle codes packed per level and
vector; optional 16-bit window of ``n_r`` tokens as in :mod:`turboquant.kvcache.stream`)::

    token_bytes = sum_{l=1..L} ceil((d / 2^l) * b_l / 8) + 2 * d / 2^L
    nbytes      = B*H*[ 2 * n_q * token_bytes + 2 * 2*d*n_r ]
"""

from __future__ import annotations

import functools
import math

import numpy as np
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

PAPER_LEVEL_BITS = (4, 2, 2, 2)
RADIUS_BYTES = 2  # fp16


def angle_density(level: int, grid: np.ndarray) -> np.ndarray:
    """Unnormalised density of the level-``level`` polar angle of a Gaussian vector (Lemma 2)."""
    if level == 1:
        return np.ones_like(grid)
    return np.sin(2 * grid) ** (2 ** (level - 1) - 1)


def angle_range(level: int) -> tuple[float, float]:
    return (0.0, 2 * math.pi) if level == 1 else (0.0, math.pi / 2)


@functools.cache
def polar_angle_codebook(level: int, bits: int, grid_points: int = 1 << 15, iterations: int = 300) -> tuple[np.ndarray, np.ndarray]:
    """Lloyd-Max centroids (``2^bits``) and decision boundaries (``2^bits - 1``) for the level's angle density.

    Level 1 is uniform, whose optimal quantizer is the uniform one (cell midpoints); the other levels are solved
    by Lloyd iterations on a fine grid of the density.
    """
    low, high = angle_range(level)
    if level == 1:
        centroids = low + (high - low) * (np.arange(2**bits) + 0.5) / 2**bits
        return centroids, (centroids[1:] + centroids[:-1]) / 2
    step = (high - low) / grid_points
    grid = low + step * (np.arange(grid_points) + 0.5)
    weight = angle_density(level, grid)
    cdf = np.cumsum(weight) / weight.sum()
    levels = 2**bits
    centroids = np.interp((np.arange(levels) + 0.5) / levels, cdf, grid)  # start at the quantiles
    for _ in range(iterations):
        boundaries = (centroids[1:] + centroids[:-1]) / 2
        cell = np.searchsorted(boundaries, grid)
        mass = np.bincount(cell, weights=weight, minlength=levels)
        moment = np.bincount(cell, weights=weight * grid, minlength=levels)
        updated = np.where(mass > 0, moment / np.maximum(mass, 1e-300), centroids)
        if np.allclose(updated, centroids, atol=1e-12, rtol=0):
            break
        centroids = updated
    return centroids, (centroids[1:] + centroids[:-1]) / 2


def polar_token_bytes(head_dim: int, level_bits: tuple[int, ...]) -> int:
    """Stored bytes of one vector: packed angle codes of every level + one fp16 radius per block."""
    levels = len(level_bits)
    return sum(math.ceil(head_dim // 2**level * bits / 8) for level, bits in enumerate(level_bits, start=1)) + \
        RADIUS_BYTES * head_dim // 2**levels


def polar_bits_per_value(head_dim: int, level_bits: tuple[int, ...]) -> float:
    return 8 * polar_token_bytes(head_dim, level_bits) / head_dim


class PolarEncoder(Encoder):
    """Preconditioning + recursive polar transform + per-level angle codebooks for one stream."""

    def __init__(self, head_dim: int, level_bits: tuple[int, ...], rotation: str, seed: int, device: torch.device) -> None:
        self.head_dim, self.level_bits, self.levels = head_dim, level_bits, len(level_bits)
        self.block = 2**self.levels
        self.rotation = tq.make_rotation(rotation, head_dim, seed=seed, device=device)
        self.codebooks = []
        for level, bits in enumerate(level_bits, start=1):
            centroids, boundaries = polar_angle_codebook(level, bits)
            self.codebooks.append((
                torch.tensor(centroids, dtype=torch.float32, device=device),
                torch.tensor(boundaries, dtype=torch.float32, device=device),
            ))

    def encode(self, x: torch.Tensor) -> Fields:
        batch, heads, tokens, dim = x.shape
        radii = self.rotation.apply(x.float()).reshape(batch, heads, tokens, dim // self.block, self.block)
        fields: Fields = {}
        for level, (bits, (_, boundaries)) in enumerate(zip(self.level_bits, self.codebooks), start=1):
            first, second = radii[..., 0::2], radii[..., 1::2]
            angles = torch.atan2(second, first)
            if level == 1:
                angles = torch.remainder(angles, 2 * math.pi)
            codes = torch.bucketize(angles.contiguous(), boundaries).to(torch.uint8)
            fields[f"angles{level}"] = tq.pack_codes(codes.reshape(batch, heads, tokens, -1), bits, check_range=False)
            radii = torch.hypot(first, second)
        fields["radius"] = radii.reshape(batch, heads, tokens, -1).to(torch.float16)
        return fields

    def decode(self, fields: Fields) -> torch.Tensor:
        radius = fields["radius"].float()
        batch, heads, tokens, blocks = radius.shape
        radii = radius.unsqueeze(-1)  # (..., blocks, 1)
        for level in range(self.levels, 0, -1):
            centroids, _ = self.codebooks[level - 1]
            count = self.block // 2**level * blocks
            codes = tq.unpack_codes(fields[f"angles{level}"], self.level_bits[level - 1], count)
            angles = centroids[codes.long()].reshape(batch, heads, tokens, blocks, -1)
            radii = torch.stack([radii * torch.cos(angles), radii * torch.sin(angles)], dim=-1).flatten(-2)
        return self.rotation.inverse(radii.reshape(batch, heads, tokens, self.head_dim))


class PolarQuantLayer(StreamLayer):
    """One PolarQuant layer (keys and values); see the module docstring for the scheme and the byte formula."""

    def __init__(self, layer_idx: int, level_bits: tuple[int, ...], rotation: str, seed: int,
                 residual_length: int = 0, fp_dtype: torch.dtype | None = None, keep_workspace: bool = True) -> None:
        super().__init__(layer_idx, fp_dtype)
        self.level_bits, self.rotation, self.seed = level_bits, rotation, seed
        self.residual_length, self.keep_workspace = residual_length, keep_workspace

    def _initialize(self) -> None:
        if self.head_dim % 2 ** len(self.level_bits):
            raise ValueError(f"PolarQuant with {len(self.level_bits)} levels needs head_dim divisible by "
                             f"{2 ** len(self.level_bits)}, got {self.head_dim}")
        seed = self.seed + 1000 * self.layer_idx
        self.key_stream, self.value_stream = (
            QuantizedStream(PolarEncoder(self.head_dim, self.level_bits, self.rotation, seed + offset, self.device),
                            self.residual_length, "block", self.fp_dtype, self.compute_dtype, self.keep_workspace)
            for offset in (0, 10)
        )

    def expected_nbytes(self) -> int:
        if not self.is_initialized:
            return 0
        n_q, n_r = self.key_stream.quantized_tokens, self.key_stream.residual_tokens
        return self.batch_size * self.num_heads * polar_nbytes_per_head(self.head_dim, self.level_bits, n_q, n_r)


def polar_nbytes_per_head(d: int, level_bits: tuple[int, ...], n_q: int, n_r: int) -> int:
    """The module docstring's byte formula for one layer, batch row and KV head."""
    return 2 * n_q * polar_token_bytes(d, level_bits) + 2 * 2 * d * n_r


def polar_memory_ratio(d: int, level_bits: tuple[int, ...], residual_length: int, tokens: int | None) -> float:
    """Ratio to the 16-bit cache after ``tokens`` tokens (``None``: steady state)."""
    if tokens is None:
        return polar_bits_per_value(d, level_bits) / 16
    n_q, n_r = quantized_and_residual(tokens, residual_length, "block")
    return polar_nbytes_per_head(d, level_bits, n_q, n_r) / (2 * 2 * d * tokens)


def polar_level_bits_for_memory_ratio(memory_ratio: float, head_dim: int, residual_length: int = 0,
                                      tokens: int | None = None, levels: int = 4,
                                      max_new_tokens: int | None = None) -> tuple[int, ...]:
    """The costliest ``(b1, b2, ..., b2)`` configuration (``b2 <= b1``) whose ratio fits ``memory_ratio`` at its peak
    over ``tokens .. tokens + max_new_tokens`` (in the steady state when ``tokens`` is None)."""
    def ratio(config: tuple[int, ...]) -> float:
        return peak_ratio_over(lambda t: polar_memory_ratio(head_dim, config, residual_length, t), tokens,
                               max_new_tokens)

    candidates = [(b1,) + (b2,) * (levels - 1) for b1 in range(1, 9) for b2 in range(1, b1 + 1)]
    fitting = [c for c in candidates if ratio(c) <= memory_ratio + 1e-9]
    if not fitting:
        raise ValueError(f"no PolarQuant level-bit configuration fits memory_ratio={memory_ratio}")
    return max(fitting, key=lambda c: (ratio(c), c))


def build_polarquant_cache(
    shape: ModelShape,
    level_bits: tuple[int, ...] | list[int] | None = None,
    memory_ratio: float | None = None,
    context_length: int | None = None,
    max_new_tokens: int | None = None,
    rotation: str = "haar",
    seed: int = 0,
    residual_length: int = 0,
    fp_dtype: torch.dtype | None = None,
    keep_workspace: bool = True,
) -> CompressedCache:
    """PolarQuant at ``level_bits`` (default the paper's (4, 2, 2, 2) = 3.875 bits) or the best fit to ``memory_ratio``."""
    if level_bits is not None and memory_ratio is not None:
        raise ValueError("give level_bits= or memory_ratio=, not both")
    if memory_ratio is not None:
        level_bits = polar_level_bits_for_memory_ratio(memory_ratio, shape.head_dim, residual_length, context_length,
                                                       max_new_tokens=max_new_tokens)
    level_bits = tuple(PAPER_LEVEL_BITS if level_bits is None else level_bits)
    if not level_bits or any(not isinstance(b, int) or not 1 <= b <= 8 for b in level_bits):
        raise ValueError(f"PolarQuant level_bits must be integers in 1..8, got {level_bits}")
    if shape.head_dim % 2 ** len(level_bits):
        raise ValueError(f"PolarQuant with {len(level_bits)} levels needs head_dim divisible by {2 ** len(level_bits)}")
    if rotation not in ("haar", "hadamard"):
        raise ValueError(f"rotation must be 'haar' or 'hadamard', got {rotation!r}")
    if residual_length < 0:
        raise ValueError(f"residual_length must be >= 0, got {residual_length}")
    layers = [
        PolarQuantLayer(i, level_bits, rotation, seed, residual_length, fp_dtype, keep_workspace)
        for i in range(shape.num_layers)
    ]
    options = {"level_bits": level_bits, "rotation": rotation, "seed": seed, "residual_length": residual_length,
               "nominal_bits_per_value": polar_bits_per_value(shape.head_dim, level_bits)}
    return CompressedCache(layers, method="polarquant", options=options)


register_method("polarquant", build_polarquant_cache)
