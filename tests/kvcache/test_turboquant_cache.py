"""TurboQuantCache specifics: presets report true bits, outliers are the top-norm channels, options validate."""

from __future__ import annotations

import pytest
import torch

from turboquant.kvcache import ModelShape, build_cache
from turboquant.kvcache.turboquant_cache import (TurboQuantCacheConfig, TurboQuantEncoder, nominal_bits_per_value,
                                                 memory_ratio_at, token_bytes, turboquant_preset)


@pytest.mark.parametrize("bits, head_dim, expected", [
    (2.5, 128, 2.5), (3.5, 128, 3.5),      # 32 of 128 channels + two fp16 norms: exactly the paper's label
    (2.5, 64, 2.75), (3.5, 64, 3.75),      # 16 of 64 channels: the norms cost twice as much per value
    (4, 128, 4.125), (3, 64, 3.25),        # integer bits: b + 16/d
])
def test_presets_report_their_true_bits(bits, head_dim, expected):
    config = TurboQuantCacheConfig(**turboquant_preset(bits, head_dim))
    assert nominal_bits_per_value(config, head_dim) == pytest.approx(expected)


def test_the_paper_split_without_norms_is_2_25_bits():
    config = TurboQuantCacheConfig(**turboquant_preset(2.5, 128))
    code_bits = sum(m * b for m, b in config.groups(128, "key")) / 128
    assert code_bits == 2.25


def test_outliers_are_the_channels_of_largest_prefill_norm():
    encoder = TurboQuantEncoder(64, [(16, 3), (48, 2)], "mse", "haar", seed=0, device=torch.device("cpu"))
    x = torch.randn(1, 2, 50, 64, generator=torch.Generator().manual_seed(0))
    loud = {0: [3, 9, 60, 61], 1: [0, 1, 2, 40]}
    for head, channels in loud.items():
        x[0, head, :, channels] *= 30
    encoder.prepare(x)
    for head, channels in loud.items():
        assert set(channels) <= set(encoder.outlier_index[0, head].tolist())
    assert encoder.outlier_index.dtype == torch.uint8 and encoder.side_nbytes() == 2 * 16
    decoded = encoder.decode(encoder.encode(x))
    assert decoded.shape == x.shape
    assert float((decoded - x).norm() / x.norm()) < 0.3


def test_outlier_split_beats_plain_bits_on_channel_outliers():
    """With a few loud channels (as real keys have), the 2.5 preset reconstructs better than plain 2 bits."""
    shape = ModelShape(num_layers=1, num_kv_heads=2, head_dim=64)
    x = torch.randn(1, 2, 400, 64, generator=torch.Generator().manual_seed(1))
    x[..., :6] *= 10
    errors = {}
    for bits in (2, 2.5):
        layer = build_cache("turboquant", shape, bits=bits).layers[0]
        layer.update(x, x.clone(), 0)
        keys, _ = layer._read()
        errors[bits] = float((keys - x).norm() / x.norm())
    assert errors[2.5] < 0.8 * errors[2]


def test_window_keeps_recent_tokens_exact_and_boundary_layers_full():
    shape = ModelShape(num_layers=4, num_kv_heads=1, head_dim=64)
    cache = build_cache("turboquant", shape, bits=3, residual_length=32, boundary_layers=1)
    assert [type(layer).__name__ for layer in cache.layers] == [
        "FullPrecisionLayer", "TurboQuantLayer", "TurboQuantLayer", "FullPrecisionLayer"]
    layer = cache.layers[1]
    x = torch.randn(1, 1, 70, 64)
    layer.update(x, x, 1)
    assert (layer.key_stream.quantized_tokens, layer.key_stream.residual_tokens) == (64, 6)
    keys, _ = layer._read()
    torch.testing.assert_close(keys[:, :, 64:], x[:, :, 64:].half().float())
    assert not torch.allclose(keys[:, :, :64], x[:, :, :64], atol=1e-2)


def test_sink_tokens_stay_exact_for_good_and_are_counted():
    """``sink_tokens=S``: the sequence's first S tokens are stored in 16 bits and read first, whatever the chunking;
    the window and the quantized blocks are counted from the token after them; the byte formula holds."""
    shape = ModelShape(num_layers=3, num_kv_heads=1, head_dim=64)
    x = torch.randn(1, 1, 75, 64)
    for chunks in ((75,), (2, 1, 40, 32)):
        cache = build_cache("turboquant", shape, bits=3, residual_length=32, sink_tokens=4)
        layer, start = cache.layers[1], 0
        for n in chunks:
            layer.update(x[:, :, start:start + n], x[:, :, start:start + n], 1)
            start += n
        stream = layer.key_stream
        assert (stream.sink_tokens, stream.quantized_tokens, stream.residual_tokens) == (4, 64, 7)
        keys, _ = layer._read()
        torch.testing.assert_close(keys[:, :, :4], x[:, :, :4].half().float())
        torch.testing.assert_close(keys[:, :, 68:], x[:, :, 68:].half().float())
        assert not torch.allclose(keys[:, :, 4:68], x[:, :, 4:68], atol=1e-2)
        assert layer.nbytes() == layer.expected_nbytes() == 64 * 2 * token_bytes([(64, 3)], "mse") + 2 * 2 * 64 * 11
    config = TurboQuantCacheConfig(key_bits=3, value_bits=3, residual_length=32, sink_tokens=4)
    assert memory_ratio_at(config, shape, 66) > memory_ratio_at(config.__class__(key_bits=3, value_bits=3,
                                                                                residual_length=32), shape, 66)


@pytest.mark.parametrize("options, message", [
    ({"bits": 9}, "key_bits"),
    ({"bits": 2.3}, "presets"),
    ({"key_bits": 3, "value_bits": 0}, "value_bits"),
    ({"key_bits": 3, "value_bits": 3, "outlier_channels": 64}, "outlier_channels"),
    ({"bits": 3, "key_variant": "qjl"}, "key_variant"),
    ({"bits": 3, "rotation": "dct"}, "rotation"),
    ({"bits": 3, "boundary_layers": 2}, "boundary_layers"),
    ({"bits": 3, "memory_ratio": 0.25}, "at most one of"),
    ({"bits": 3, "vllm_preset": "turboquant_4bit_nc"}, "at most one of"),
    ({"vllm_preset": "turboquant_9bit"}, "unknown vLLM TurboQuant preset"),
    ({"key_format": "fp8", "key_bits": 4}, "needs key_bits=8"),
    ({"value_format": "int4"}, "value_format must be one of"),
    ({"norm_correction": True, "key_variant": "prod"}, "not defined for"),
    ({"bits": 3.5, "value_format": "uniform"}, "outlier channel split applies"),
    ({"fp16_layers": [99]}, "do not exist"),
    ({"memory_ratio": 0.01}, "no TurboQuant preset"),
    ({"bits": 3, "window": 4}, "unknown TurboQuant options"),
    ({"bits": 3, "sink_tokens": -1}, "sink_tokens"),
])
def test_bad_options_raise_value_errors(options, message):
    shape = ModelShape(num_layers=3, num_kv_heads=2, head_dim=64)
    with pytest.raises(ValueError, match=message):
        build_cache("turboquant", shape, **options)


def test_every_written_token_is_stored_packed_and_the_decode_hook_is_used():
    shape = ModelShape(num_layers=1, num_kv_heads=2, head_dim=64)
    calls = []

    def decode_fn(encoder, fields):
        calls.append(fields["codes0"].shape[2])
        return encoder.decode(fields)

    layer = build_cache("turboquant", shape, key_bits=3, value_bits=2, decode_fn=decode_fn).layers[0]
    layer.update(torch.randn(1, 2, 10, 64), torch.randn(1, 2, 10, 64), 0)
    for _ in range(3):
        keys, values = layer.update(torch.randn(1, 2, 1, 64), torch.randn(1, 2, 1, 64), 0)
    assert keys.shape == values.shape == (1, 2, 13, 64)
    fields = layer.key_stream.fields
    assert fields["codes0"].dtype == torch.uint8 and fields["codes0"].shape == (1, 2, 13, 24)  # 64 * 3 bits
    assert fields["norms0"].dtype == torch.float16 and fields["norms0"].shape == (1, 2, 13)
    assert layer.value_stream.fields["codes0"].shape == (1, 2, 13, 16)  # 64 * 2 bits
    assert layer.key_stream.residual is None or layer.key_stream.residual_tokens == 0
    assert calls == [10, 10, 1, 1, 1, 1, 1, 1]  # each chunk decoded once per stream, through the hook


def test_keys_only_split_as_in_the_authors_code():
    shape = ModelShape(num_layers=1, num_kv_heads=2, head_dim=128)
    cache = build_cache("turboquant", shape, bits=2.5, value_bits=2, value_outliers=False)
    config = TurboQuantCacheConfig(**{**turboquant_preset(2.5, 128), "value_outliers": False})
    assert config.groups(128, "value") == [(128, 2)]
    assert nominal_bits_per_value(config, 128) == pytest.approx((2.5 + 2 + 16 / 128) / 2)
    layer = cache.layers[0]
    layer.update(torch.randn(1, 2, 40, 128), torch.randn(1, 2, 40, 128), 0)
    assert layer.value_stream.encoder.side_nbytes() == 0 and layer.key_stream.encoder.side_nbytes() == 2 * 32
    assert layer.nbytes() == layer.expected_nbytes()
