"""TurboQuant key centering (``center_keys``): keys minus their prefill mean are quantized, the mean added back.

Exact for attention (``softmax_j(q . k_j)`` ignores a shift common to all keys); smaller error when the keys
share a large offset; the fp16 mean is counted in the byte formula.
"""

from __future__ import annotations

import pytest
import torch

from tests.kvcache.tiny_llama import next_token_logits, relative_error
from turboquant.kvcache import ModelShape, build_cache
from turboquant.kvcache.turboquant_cache import TurboQuantEncoder

SHAPE = ModelShape(num_layers=1, num_kv_heads=2, head_dim=64)


def _encoder(center: bool) -> TurboQuantEncoder:
    return TurboQuantEncoder(64, [(16, 4), (48, 3)], "mse", "haar", seed=3, device=torch.device("cpu"), center=center)


def test_centered_encoder_quantizes_keys_minus_the_prefill_mean_and_adds_it_back():
    """Prefill and later tokens: decode(encode(x)) = mu + Q(x - mu), mu the fp16 prefill mean; outliers of x - mu."""
    generator = torch.Generator().manual_seed(0)
    prefill = 5 + torch.randn(2, 2, 40, 64, generator=generator)
    later = 5 + torch.randn(2, 2, 3, 64, generator=generator)
    prefill[..., 7] += 30  # a common offset on one channel: an outlier of k, not of k - mu
    centered, plain = _encoder(center=True), _encoder(center=False)
    centered.prepare(prefill)
    mu = centered.key_mean
    assert mu.dtype == torch.float16 and mu.shape == (2, 2, 64)
    torch.testing.assert_close(mu.float(), prefill.mean(dim=2), atol=2e-2, rtol=1e-3)
    shift = mu.float().unsqueeze(2)
    plain.prepare(prefill - shift)
    assert torch.equal(centered.outlier_index, plain.outlier_index)
    assert 7 not in centered.outlier_index.flatten().tolist()
    for x in (prefill, later):
        assert torch.equal(centered.decode(centered.encode(x)), plain.decode(plain.encode(x - shift)) + shift)
    assert centered.side_nbytes() == plain.side_nbytes() + 2 * 2 * 64 * 2  # B*H*d fp16 means


def test_centering_is_exact_for_attention_in_the_tiny_llama(tiny_model, tiny_config, prompt_ids):
    """On the tiny Llama's keys the read-back keys are mu + Q(k - mu): dropping mu changes no attention weight
    (q . mu shifts all logits of a query equally), and the model's logits stay as close to the full cache."""
    def without_mean(encoder, fields):
        decoded = encoder.decode(fields)
        return decoded if encoder.key_mean is None else decoded - encoder.key_mean.float().unsqueeze(2)

    ids = prompt_ids[:, :120]
    with_mean = build_cache("turboquant", tiny_config, bits=3.5, center_keys=True)
    shifted = build_cache("turboquant", tiny_config, bits=3.5, center_keys=True, decode_fn=without_mean)
    with torch.no_grad():  # prefill only: attention reads the new keys as computed, so both store the same keys
        for cache in (with_mean, shifted):
            tiny_model(ids, cache=cache)
    queries = torch.randn(1, 2, 8, 64, generator=torch.Generator().manual_seed(4))
    for layer, other in zip(with_mean.layers, shifted.layers):
        keys, keys_without_mean = layer.key_stream.read(), other.key_stream.read()
        mu = layer.key_stream.encoder.key_mean.float().unsqueeze(2)
        assert float(mu.abs().max()) > 0.01  # the test would be vacuous with a zero mean
        torch.testing.assert_close(keys - keys_without_mean, mu.expand_as(keys), atol=1e-5, rtol=0)
        weights = torch.softmax(queries @ keys.transpose(-1, -2), dim=-1)
        torch.testing.assert_close(torch.softmax(queries @ keys_without_mean.transpose(-1, -2), dim=-1), weights,
                                   atol=1e-6, rtol=1e-5)
        assert torch.equal(layer.value_stream.read(), other.value_stream.read())
    logits = {name: next_token_logits(tiny_model, ids, build_cache(method, tiny_config, **options))
              for name, method, options in [("full", "full", {}), ("plain", "turboquant", {"bits": 3.5}),
                                            ("centered", "turboquant", {"bits": 3.5, "center_keys": True})]}
    assert relative_error(logits["centered"], logits["full"]) < 2 * relative_error(logits["plain"], logits["full"])


@pytest.mark.parametrize("bits", [3, 4])
def test_centering_cuts_the_attention_error_on_keys_with_a_common_offset(bits):
    """Keys = offset (norm ~33) + unit-variance noise: the error of attention outputs drops several-fold."""
    generator = torch.Generator().manual_seed(0)
    keys = 4 * torch.randn(1, 2, 1, 64, generator=generator) + torch.randn(1, 2, 200, 64, generator=generator)
    values = torch.randn(1, 2, 200, 64, generator=generator)
    queries = torch.randn(1, 2, 16, 64, generator=generator)

    def attention(k: torch.Tensor) -> torch.Tensor:
        return torch.softmax(queries @ k.transpose(-1, -2) / 8, dim=-1) @ values

    reference, errors = attention(keys), {}
    for center in (False, True):
        layer = build_cache("turboquant", SHAPE, bits=bits, center_keys=center).layers[0]
        layer.update(keys[:, :, :150], values[:, :, :150], 0)  # prefill fixes mu; the last 50 keys reuse it
        stored_keys, _ = layer.update(keys[:, :, 150:], values[:, :, 150:], 0)
        errors[center] = relative_error(attention(stored_keys), reference)
    assert errors[True] < 0.4 * errors[False]


def test_bytes_count_the_mean_with_outliers_window_and_boundary_layers():
    shape = ModelShape(num_layers=4, num_kv_heads=2, head_dim=64)
    caches = {center: build_cache("turboquant", shape, bits=3.5, residual_length=32, boundary_layers=1,
                                  center_keys=center) for center in (False, True)}
    assert [type(layer).__name__ for layer in caches[True].layers] == [
        "FullPrecisionLayer", "TurboQuantLayer", "TurboQuantLayer", "FullPrecisionLayer"]
    x = torch.randn(1, 2, 70, 64, generator=torch.Generator().manual_seed(2))
    for cache in caches.values():
        for index, layer in enumerate(cache.layers):
            layer.update(x, x, index)
            layer.update(x[:, :, :1], x[:, :, :1], index)
    for quantized, plain in zip(caches[True].layers[1:3], caches[False].layers[1:3]):
        assert quantized.nbytes() == quantized.expected_nbytes() == plain.nbytes() + 2 * 64 * 2
        assert quantized.key_stream.residual_tokens == 7 and quantized.value_stream.encoder.key_mean is None
    assert caches[True].options["center_keys"] is True


def test_center_keys_must_be_a_bool():
    with pytest.raises(ValueError, match="center_keys"):
        build_cache("turboquant", SHAPE, bits=3, center_keys="yes")
