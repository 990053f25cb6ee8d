"""SnapKV / PyramidKV: the captured window queries are the model's, selection keeps the voted tokens."""

from __future__ import annotations

import math

import pytest
import torch
import transformers

from tests.kvcache.tiny_llama import tiny_llama_config
from turboquant.kvcache import attach, build_cache
from turboquant.kvcache.eviction import observation_votes, pyramid_selected_counts, snapkv_select


def test_window_queries_are_the_models_own(monkeypatch):
    """The queries the attention function hands SnapKV, with the prefill's keys, give the eager attention
    probabilities of the model's own forward pass (the window rows)."""
    from turboquant.kvcache import eviction

    torch.manual_seed(0)
    config = tiny_llama_config(attn_implementation="eager")
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 256, (1, 80), generator=torch.Generator().manual_seed(2))
    window = 16
    captured = {}
    original = eviction.snapkv_select

    def capturing(keys, values, window_queries, keep, window_, kernel_size, pooling):
        captured[len(captured)] = (window_queries[:, :, -window_:], keys)
        return original(keys, values, window_queries, keep, window_, kernel_size, pooling)

    monkeypatch.setattr(eviction, "snapkv_select", capturing)
    cache = build_cache("snapkv", config, budget=40, window_size=window, fp_dtype=torch.float32)
    with torch.no_grad(), attach(model, cache):
        out = model(ids, cache=cache, output_attentions=True)
    assert sorted(captured) == list(range(config.num_hidden_layers))
    assert [layer.stored_tokens() for layer in cache.layers] == [40] * config.num_hidden_layers
    for layer_idx, attentions in enumerate(out.attentions):
        queries, keys = captured[layer_idx]  # (1, heads, window, d), (1, kv_heads, n, d)
        group = config.num_attention_heads // config.num_key_value_heads
        logits = queries @ keys.repeat_interleave(group, dim=1).transpose(2, 3) / math.sqrt(config.head_dim)
        causal = torch.ones(window, window, dtype=torch.bool).triu(1)
        logits[..., -window:] = logits[..., -window:].masked_fill(causal, float("-inf"))
        torch.testing.assert_close(logits.softmax(-1), attentions[:, :, -window:], rtol=1e-4, atol=1e-6)


def test_selection_keeps_the_most_attended_tokens_and_the_window():
    generator = torch.Generator().manual_seed(0)
    keys = torch.randn(1, 2, 100, 16, generator=generator) * 0.1
    values = torch.randn(1, 2, 100, 16, generator=generator)
    queries = torch.randn(1, 4, 8, 16, generator=generator)
    keys[0, 0, 37] = queries[0, 0:2].mean(dim=(0, 1)) * 50  # KV head 0: token 37 draws all the attention
    kept_keys, kept_values = snapkv_select(keys, values, queries, keep=20, window=8, kernel_size=1, pooling="maxpool")
    assert kept_keys.shape == (1, 2, 20, 16)
    assert any(torch.equal(row, keys[0, 0, 37]) for row in kept_keys[0, 0, :12])
    torch.testing.assert_close(kept_keys[:, :, -8:], keys[:, :, -8:])
    torch.testing.assert_close(kept_values[:, :, -8:], values[:, :, -8:])
    votes = observation_votes(queries, keys, kernel_size=1, pooling="maxpool")
    assert votes.shape == (1, 2, 92) and int(votes[0, 0].argmax()) == 37
    # kept prefix tokens keep their original order
    positions = [int((keys[0, 1, :92] == row).all(-1).nonzero()) for row in kept_keys[0, 1, :12]]
    assert positions == sorted(positions)


def test_max_pooling_keeps_neighbours_of_a_voted_token():
    votes_source = torch.zeros(1, 1, 50, 4)
    queries = torch.zeros(1, 1, 4, 4)
    queries[..., 0] = 1.0
    votes_source[0, 0, 20, 0] = 30.0
    votes = observation_votes(queries, votes_source, kernel_size=7, pooling="maxpool")
    top = set(votes[0, 0].topk(7).indices.tolist())
    assert top == set(range(17, 24))


def test_pyramid_counts_decrease_and_sum_to_the_snapkv_total():
    counts = pyramid_selected_counts(average_selected=100, prefix_tokens=5000, num_layers=30, beta=20)
    assert sum(counts) == 3000
    assert counts == sorted(counts, reverse=True)
    assert counts[0] == pytest.approx(195, abs=1) and counts[-1] == pytest.approx(5, abs=1)
    clamped = pyramid_selected_counts(average_selected=100, prefix_tokens=150, num_layers=4, beta=20)
    assert sum(clamped) == 400 and max(clamped) <= 150


def test_eviction_without_attach_is_a_clear_error(tiny_model, tiny_config, prompt_ids):
    cache = build_cache("snapkv", tiny_config)
    with pytest.raises(ValueError, match="attach"), torch.no_grad():
        tiny_model(prompt_ids, cache=cache)


def test_short_prompts_are_kept_whole(tiny_model, tiny_config):
    cache = build_cache("snapkv", tiny_config, budget=64)
    ids = torch.randint(0, 256, (1, 40))
    with torch.no_grad(), attach(tiny_model, cache):
        tiny_model(ids, cache=cache)
    assert [layer.stored_tokens() for layer in cache.layers] == [40, 40, 40]


def test_pyramidkv_refuses_eager_attention():
    config = tiny_llama_config(attn_implementation="eager")
    model = transformers.LlamaForCausalLM(config).eval()
    with pytest.raises(ValueError, match="SDPA"), attach(model, build_cache("pyramidkv", config)):
        pass


def test_a_prefill_no_attention_function_read_fails_loudly(tiny_model, tiny_config, prompt_ids):
    """A model whose attention bypasses the registered function never hands SnapKV its queries: leaving attach
    says so instead of keeping an empty cache; attach takes only this package's caches and does not nest."""
    cache = build_cache("snapkv", tiny_config, budget=64)
    before = tiny_model.config._attn_implementation
    with pytest.raises(RuntimeError, match="no attention call read the prompt"), torch.no_grad():
        with attach(tiny_model, cache):
            tiny_model.set_attn_implementation(before)  # as a model with its own attention dispatch would
            tiny_model(prompt_ids[:, :100], cache=cache)
    assert tiny_model.config._attn_implementation == before
    with pytest.raises(TypeError, match="build_cache"), attach(tiny_model, transformers.DynamicCache()):
        pass
    with pytest.raises(RuntimeError, match="do not nest"), attach(tiny_model, build_cache("full", tiny_config)):
        with attach(tiny_model, build_cache("full", tiny_config)):
            pass
    assert tiny_model.config._attn_implementation == before
