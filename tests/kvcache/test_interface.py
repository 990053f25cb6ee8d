"""Every cache is a working transformers Cache: generation, bookkeeping, byte formulas, memory budgets."""

from __future__ import annotations

import sys
import warnings

import pytest
import torch
from transformers import DynamicCache

from tests.kvcache.tiny_llama import next_token_logits, relative_error
from turboquant.kvcache import ModelShape, attach, available_methods, build_cache

EVERY_METHOD = [
    ("full", {}),
    ("turboquant", {"bits": 4}),
    ("turboquant", {"bits": 2.5}),
    ("turboquant", {"bits": 3, "key_variant": "prod"}),
    ("turboquant", {"bits": 3.5, "residual_length": 32, "boundary_layers": 1, "rotation": "hadamard"}),
    ("kivi", {"bits": 2, "residual_length": 64}),
    ("kivi", {"bits": 5}),
    ("polarquant", {}),
    ("polarquant", {"level_bits": (3, 2, 2, 2), "residual_length": 16}),
    ("snapkv", {}),
    ("snapkv", {"budget": 100, "pooling": "avgpool", "kernel_size": 5}),
    ("pyramidkv", {}),
]


def test_every_registered_method_is_exercised():
    assert {method for method, _ in EVERY_METHOD} == set(available_methods())


def test_full_cache_matches_transformers_dynamic_cache(tiny_model, tiny_config, prompt_ids):
    reference = next_token_logits(tiny_model, prompt_ids, DynamicCache(config=tiny_config))
    full = next_token_logits(tiny_model, prompt_ids, build_cache("full", tiny_config))
    assert relative_error(full, reference) < 2e-3  # fp16 storage of K/V is the only difference
    exact = next_token_logits(tiny_model, prompt_ids, build_cache("full", tiny_config, fp_dtype=torch.float32))
    assert relative_error(exact, reference) < 1e-5


@pytest.mark.parametrize("method, options", EVERY_METHOD, ids=lambda v: str(v))
def test_generate_runs_and_bytes_match_the_formula(tiny_model, tiny_config, prompt_ids, method, options):
    cache = build_cache(method, tiny_config, **options)
    prompt = prompt_ids[:, :200]
    with attach(tiny_model, cache), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        out = tiny_model.generate(prompt, past_key_values=cache, max_new_tokens=6, do_sample=False, min_new_tokens=6)
    assert out.shape == (1, 206)
    assert cache.get_seq_length() == 205  # the last generated token is never fed back
    assert cache.nbytes() == cache.expected_nbytes() > 0
    for layer in cache.layers:
        assert layer.nbytes() == layer.expected_nbytes()
    if method == "full":
        assert cache.memory_ratio() == 1.0
    else:
        assert cache.memory_ratio() < 1.0
    assert cache.compression_ratio() == pytest.approx(1 / cache.memory_ratio())
    assert cache.bits_per_value() == pytest.approx(16 * cache.memory_ratio())


def test_generation_matches_between_full_and_dynamic_cache(tiny_model, tiny_config, prompt_ids):
    prompt = prompt_ids[:, :50]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        reference = tiny_model.generate(prompt, past_key_values=DynamicCache(config=tiny_config), max_new_tokens=8,
                                        do_sample=False)
        ours = tiny_model.generate(prompt, cache=build_cache("full", tiny_config, fp_dtype=torch.float32),
                                   max_new_tokens=8, do_sample=False)
    assert torch.equal(reference, ours)


@pytest.mark.parametrize("method, options, tolerance", [
    ("turboquant", {"bits": 8}, 0.03),
    ("kivi", {"bits": 8}, 0.01),
    ("polarquant", {"level_bits": (8, 8, 8, 8)}, 0.03),
])
def test_eight_bit_caches_give_logits_close_to_the_full_cache(tiny_model, tiny_config, prompt_ids, method, options,
                                                              tolerance):
    reference = next_token_logits(tiny_model, prompt_ids, build_cache("full", tiny_config))
    quantized = next_token_logits(tiny_model, prompt_ids, build_cache(method, tiny_config, **options))
    assert relative_error(quantized, reference) < tolerance
    low_bits = next_token_logits(tiny_model, prompt_ids, build_cache(method, tiny_config, **{
        "turboquant": {"bits": 2}, "kivi": {"bits": 2, "residual_length": 32},
        "polarquant": {"level_bits": (2, 1, 1, 1)}}[method]))
    assert relative_error(low_bits, reference) > 3 * relative_error(quantized, reference)


@pytest.mark.parametrize("method, configs", [
    ("turboquant", [{"bits": b} for b in (2, 3, 4, 5)]),
    ("turboquant", [{"bits": b, "key_variant": "prod"} for b in (2, 3, 4, 5)]),
    ("kivi", [{"bits": b, "residual_length": 32} for b in (2, 3, 4, 5)]),
    ("polarquant", [{"level_bits": bits} for bits in ((2, 1, 1, 1), (3, 2, 2, 2), (4, 3, 3, 3), (6, 4, 4, 4))]),
])
def test_attention_input_error_decreases_with_bits(tiny_model, tiny_config, prompt_ids, method, configs):
    """Relative error of the keys/values read back by attention, and of the logits, shrink with every bit."""
    reference = next_token_logits(tiny_model, prompt_ids, build_cache("full", tiny_config))
    key_errors, logit_errors = [], []
    for options in configs:
        cache = build_cache(method, tiny_config, **options)
        logits = next_token_logits(tiny_model, prompt_ids, cache)
        layer = cache.layers[1]
        keys, _ = layer._read()
        exact = build_cache("full", tiny_config, fp_dtype=torch.float32)
        with torch.no_grad():
            tiny_model(prompt_ids, cache=exact)
        exact_keys = exact.layers[1].keys
        key_errors.append(relative_error(keys, exact_keys))
        logit_errors.append(relative_error(logits, reference))
    assert key_errors == sorted(key_errors, reverse=True), key_errors
    assert logit_errors[-1] < logit_errors[0], logit_errors


@pytest.mark.parametrize("method", ["turboquant", "kivi", "polarquant", "snapkv", "pyramidkv"])
def test_every_method_honours_a_25_percent_budget(tiny_model, tiny_config, method):
    tokens = 1024
    ids = torch.randint(0, 256, (1, tokens), generator=torch.Generator().manual_seed(3))
    cache = build_cache(method, tiny_config, memory_ratio=0.25, context_length=tokens)
    with torch.no_grad(), attach(tiny_model, cache):
        tiny_model(ids, cache=cache)
    assert 0.15 < cache.memory_ratio() <= 0.25
    assert cache.nbytes() == cache.expected_nbytes()


def test_pyramidkv_and_snapkv_store_the_same_total(tiny_model, tiny_config, prompt_ids):
    stored = {}
    for method in ("snapkv", "pyramidkv"):
        cache = build_cache(method, tiny_config, budget=120)
        with torch.no_grad(), attach(tiny_model, cache):
            tiny_model(prompt_ids, cache=cache)
        stored[method] = [layer.stored_tokens() for layer in cache.layers]
    assert stored["snapkv"] == [120, 120, 120]
    assert sum(stored["pyramidkv"]) == 360
    assert stored["pyramidkv"] == sorted(stored["pyramidkv"], reverse=True) and stored["pyramidkv"][0] > 120


def test_workspace_equals_decoding_the_packed_store_every_step(tiny_model, tiny_config, prompt_ids):
    for method, options in (("turboquant", {"bits": 2.5}), ("kivi", {"bits": 3, "residual_length": 32}),
                            ("polarquant", {})):
        with_workspace = next_token_logits(tiny_model, prompt_ids, build_cache(method, tiny_config, **options))
        from_codes = next_token_logits(tiny_model, prompt_ids,
                                       build_cache(method, tiny_config, keep_workspace=False, **options))
        assert torch.equal(with_workspace, from_codes), method


def test_beam_search_is_refused_clearly(tiny_model, tiny_config, prompt_ids):
    cache = build_cache("turboquant", tiny_config, bits=4)
    with pytest.raises(NotImplementedError, match="beam search"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tiny_model.generate(prompt_ids[:, :20], past_key_values=cache, max_new_tokens=3, num_beams=2, do_sample=False)


@pytest.mark.parametrize("method, options", [("snapkv", {"budget": 80}), ("pyramidkv", {"budget": 80}),
                                             ("turboquant", {"bits": 3})])
def test_generate_with_an_attention_mask_matches_generate_without(tiny_model, tiny_config, prompt_ids, method, options):
    """Tokenizer outputs carry an attention mask; positions then come from it, not from the cache length."""
    prompt = prompt_ids[:, :200]
    runs = []
    for kwargs in ({}, {"attention_mask": torch.ones_like(prompt)}):
        cache = build_cache(method, tiny_config, **options)
        with attach(tiny_model, cache), warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            runs.append(tiny_model.generate(prompt, cache=cache, max_new_tokens=5, do_sample=False, **kwargs))
    assert torch.equal(runs[0], runs[1])


def test_evicted_cache_keeps_true_positions(tiny_model, tiny_config, prompt_ids):
    """After eviction the next token is still at position n (RoPE), not at the number of stored tokens."""
    positions = []
    handle = tiny_model.model.rotary_emb.register_forward_hook(
        lambda module, args, kwargs, out: positions.append(kwargs.get("position_ids", args[-1]).flatten().tolist()),
        with_kwargs=True)
    cache = build_cache("snapkv", tiny_config, budget=256)  # 299 prompt tokens: 43 dropped per layer
    try:
        next_token_logits(tiny_model, prompt_ids, cache)
    finally:
        handle.remove()
    assert cache.layers[0].stored_tokens() == 257 and cache.get_seq_length() == 300
    assert positions[-1] == [299]
    no_drop = next_token_logits(tiny_model, prompt_ids, build_cache("snapkv", tiny_config, budget=400))
    torch.testing.assert_close(no_drop, next_token_logits(tiny_model, prompt_ids, build_cache("full", tiny_config)))


@pytest.mark.parametrize("method, options", [
    ("turboquant", {"bits": 3.5, "residual_length": 32, "sink_tokens": 4}),
    ("kivi", {"bits": 2, "residual_length": 64}),
    ("polarquant", {"residual_length": 16}),
])
def test_a_decode_step_copies_the_stored_tokens_once(method, options, monkeypatch):
    """A stream cache stores its tokens in pieces (sink, decoded quantized part, window); ``update`` returns
    ``[pieces ; new token]`` joined by one ``torch.cat`` per tensor, equal to reading the store and appending."""
    shape = ModelShape(num_layers=1, num_kv_heads=2, head_dim=64)
    layer = build_cache(method, shape, **options).layers[0]
    x = torch.randn(1, 2, 150, 64, generator=torch.Generator().manual_seed(0))
    layer.update(x[:, :, :149], x[:, :, :149].flip(-1), 0)
    past_keys, past_values = layer._read()
    cat, joins = torch.cat, []

    def counting_cat(tensors, *args, **kwargs):
        joined = cat(tensors, *args, **kwargs)
        joins.append(joined.shape[-2])
        return joined

    monkeypatch.setattr(torch, "cat", counting_cat)
    keys, values = layer.update(x[:, :, 149:], x[:, :, 149:].flip(-1), 0)
    monkeypatch.setattr(torch, "cat", cat)
    # copies of the whole store (the window's own append copies only the window): one for keys, one for values
    assert [n for n in joins if n >= 149] == [150, 150]
    torch.testing.assert_close(keys, cat([past_keys, x[:, :, 149:]], dim=-2))
    torch.testing.assert_close(values, cat([past_values, x[:, :, 149:].flip(-1)], dim=-2))


HOST_READS = ("__bool__", "__int__", "__float__", "__index__", "item", "tolist")


@pytest.mark.parametrize("method, options, allowed", [
    ("kivi", {"bits": 3, "residual_length": 32}, set()),  # values slide: one token quantized and packed per step
    ("polarquant", {"residual_length": 0}, set()),
    # the torch reference encoder's norm-range branch and the extreme-row check, one each per quantizer call
    ("turboquant", {"bits": 3.5, "residual_length": 0}, {"unit_vectors", "_redo_extreme_rows"}),
])
def test_a_decode_step_reads_back_only_the_named_checks(method, options, allowed, monkeypatch):
    """A decode step that quantizes and packs a token reads no tensor value back to the host (on a GPU each read
    is a synchronisation, which costs milliseconds when processes share the device) except the checks named;
    in particular codes quantized in range by construction are packed without the range check."""
    shape = ModelShape(num_layers=1, num_kv_heads=2, head_dim=64)
    layer = build_cache(method, shape, **options).layers[0]
    x = torch.randn(1, 2, 80, 64, generator=torch.Generator().manual_seed(0))
    layer.update(x[:, :, :79], x[:, :, :79].flip(-1), 0)
    stored = layer.nbytes()
    readers: list[str] = []
    for name in HOST_READS:
        method_ = getattr(torch.Tensor, name)

        def counting(self, *args, _method=method_, **kwargs):
            readers.append(sys._getframe(1).f_code.co_name)
            return _method(self, *args, **kwargs)
        monkeypatch.setattr(torch.Tensor, name, counting)
    layer.update(x[:, :, 79:], x[:, :, 79:].flip(-1), 0)
    monkeypatch.undo()
    assert layer.nbytes() > stored  # the step quantized and stored its token
    assert set(readers) <= allowed, readers
