"""KIVI and PolarQuant: the quantization each paper describes, their byte costs, and option checks."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from turboquant.kvcache import ModelShape, build_cache
from turboquant.kvcache.kivi import asymmetric_quantize, kivi_bits_per_value
from turboquant.kvcache.polarquant import PolarEncoder, polar_angle_codebook, polar_bits_per_value

SHAPE = ModelShape(num_layers=2, num_kv_heads=2, head_dim=64)


def test_asymmetric_quantization_hits_min_and_max_exactly():
    groups = torch.tensor([[0.0, 1.0, 2.0, 3.0, 1.5]])
    codes, scale, zero = asymmetric_quantize(groups, bits=2, dim=1)
    assert codes.tolist() == [[0, 1, 2, 3, 2]]
    assert float(scale) == 1.0 and float(zero) == 0.0


def test_kivi_quantizes_keys_per_channel_and_values_per_token():
    """A key channel with a huge offset only costs precision in that channel (per-channel groups)."""
    layer = build_cache("kivi", SHAPE, bits=2, group_size=32, residual_length=32).layers[0]
    x = torch.randn(1, 2, 64, 64, generator=torch.Generator().manual_seed(0))
    keys_in = x.clone()
    keys_in[..., 5] += 100.0
    layer.update(keys_in, x, 0)
    keys, values = layer._read()
    assert layer.key_stream.quantized_tokens == 64 and layer.value_stream.quantized_tokens == 32
    other = [c for c in range(64) if c != 5]
    assert float((keys[..., other] - keys_in[..., other]).abs().max()) < 1.5  # ranges of ~±3 at 2 bits
    torch.testing.assert_close(values[:, :, 32:], x[:, :, 32:].half().float())  # sliding fp16 window
    assert layer.key_stream.fields["scale"].shape == (1, 2, 2, 64)    # per (token group, channel)
    assert layer.value_stream.fields["scale"].shape == (1, 2, 32, 2)  # per (token, channel group)


def test_kivi_streaming_flushes_keys_in_blocks_and_values_one_by_one():
    layer = build_cache("kivi", SHAPE, bits=4, group_size=32, residual_length=64).layers[0]
    layer.update(torch.randn(1, 2, 100, 64), torch.randn(1, 2, 100, 64), 0)
    assert (layer.key_stream.quantized_tokens, layer.key_stream.residual_tokens) == (64, 36)
    assert (layer.value_stream.quantized_tokens, layer.value_stream.residual_tokens) == (36, 64)
    for _ in range(28):
        layer.update(torch.randn(1, 2, 1, 64), torch.randn(1, 2, 1, 64), 0)
    assert (layer.key_stream.quantized_tokens, layer.key_stream.residual_tokens) == (128, 0)
    assert (layer.value_stream.quantized_tokens, layer.value_stream.residual_tokens) == (64, 64)
    assert layer.nbytes() == layer.expected_nbytes()
    assert kivi_bits_per_value(3, 32) == 4.0


def test_polar_angle_codebooks_follow_the_level_densities():
    centroids, boundaries = polar_angle_codebook(1, 4)  # uniform on [0, 2*pi): the uniform quantizer
    np.testing.assert_allclose(centroids, (np.arange(16) + 0.5) * 2 * math.pi / 16, atol=1e-6)
    for level in (2, 3, 4):
        centroids, boundaries = polar_angle_codebook(level, 2)
        np.testing.assert_allclose(centroids + centroids[::-1], math.pi / 2, atol=2e-4)  # symmetric about pi/4 (grid step 5e-5)
        assert len(boundaries) == 3
    spread = [polar_angle_codebook(level, 2)[0] for level in (2, 3, 4)]
    widths = [c[-1] - c[0] for c in spread]
    assert widths == sorted(widths, reverse=True)  # higher levels concentrate around pi/4


def test_polar_transform_round_trips_and_costs_3_875_bits():
    assert polar_bits_per_value(64, (4, 2, 2, 2)) == 3.875
    assert polar_bits_per_value(128, (4, 2, 2, 2)) == 3.875
    x = torch.randn(1, 2, 200, 64, generator=torch.Generator().manual_seed(0))
    fine = PolarEncoder(64, (8, 8, 8, 8), "haar", seed=0, device=torch.device("cpu"))
    paper = PolarEncoder(64, (4, 2, 2, 2), "haar", seed=0, device=torch.device("cpu"))
    fine_error = float((fine.decode(fine.encode(x)) - x).norm() / x.norm())
    paper_error = float((paper.decode(paper.encode(x)) - x).norm() / x.norm())
    assert fine_error < 0.02 < paper_error < 0.3
    fields = paper.encode(x)
    assert sum(t[0, 0, 0].numel() * t.element_size() for t in fields.values()) == 31  # 62 bits per 16 coords


@pytest.mark.parametrize("method, options, message", [
    ("kivi", {"bits": 9}, "bits"),
    ("kivi", {"bits": 2.5}, "bits"),
    ("kivi", {"bits": 2, "memory_ratio": 0.25}, "exactly one"),
    ("kivi", {"bits": 2, "residual_length": 40}, "multiple"),
    ("kivi", {"bits": 2, "group_size": 128, "residual_length": 128}, "divide"),
    ("polarquant", {"level_bits": (4, 0, 2, 2)}, "level_bits"),
    ("polarquant", {"level_bits": (4, 2, 2, 2, 2, 2, 2)}, "divisible"),
    ("polarquant", {"rotation": "dct"}, "rotation"),
    ("snapkv", {"budget": 100, "memory_ratio": 0.2}, "not both"),
    ("snapkv", {"kernel_size": 4}, "odd kernel_size"),
    ("snapkv", {"pooling": "median"}, "pooling"),
    ("pyramidkv", {"beta": 0.5}, "beta"),
    ("full", {"bits": 4}, "bad options"),
    ("nope", {}, "unknown KV cache method"),
])
def test_bad_options_raise_value_errors(method, options, message):
    with pytest.raises(ValueError, match=message):
        build_cache(method, SHAPE, **options)
