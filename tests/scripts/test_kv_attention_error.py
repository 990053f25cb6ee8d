"""scripts/kv_attention_error.py on a tiny random Llama: exact caches read back exactly, quantizers do not."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
import transformers

from experiments.kv_generation import KVMethod
from tests.kvcache.tiny_llama import tiny_llama_config

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "kv_attention_error.py"
spec = importlib.util.spec_from_file_location("kv_attention_error", SCRIPT)
kv_attention_error = importlib.util.module_from_spec(spec)
spec.loader.exec_module(kv_attention_error)


@pytest.fixture(scope="module")
def captured():
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(tiny_llama_config()).eval()
    ids = torch.randint(0, model.config.vocab_size, (1, 96))
    return model, kv_attention_error.capture(model, ids, n_queries=16), ids


def test_capture_matches_the_models_own_attention_shapes(captured) -> None:
    model, layers, _ = captured
    assert len(layers) == model.config.num_hidden_layers
    head_dim = model.config.head_dim
    assert layers[0]["keys"].shape == (1, model.config.num_key_value_heads, 96, head_dim)
    assert layers[0]["queries"].shape == (1, model.config.num_attention_heads, 16, head_dim)


def test_full_cache_reads_back_exactly_and_quantizers_err_with_fewer_bits(captured) -> None:
    model, layers, _ = captured
    full = kv_attention_error.layer_errors(model, layers, KVMethod("full", "Full", "full", {}))
    assert all(row["output_error"] < 1e-3 and row["key_error"] < 1e-3 for row in full)  # fp16 storage only
    errors = {
        bits: sum(r["output_error"] for r in kv_attention_error.layer_errors(
            model, layers, KVMethod("tq", "TQ", "turboquant", {"bits": bits, "seed": 0})))
        for bits in (2, 4)
    }
    assert 0 < errors[4] < errors[2]


def test_eviction_methods_are_refused(captured) -> None:
    model, layers, _ = captured
    snap = KVMethod("snapkv", "SnapKV", "snapkv", {"budget": 16, "window_size": 8})
    with pytest.raises(Exception):  # noqa: B017 - eviction needs the prefill's query hooks or refuses the length
        kv_attention_error.layer_errors(model, layers, snap)


def test_summary_tables_means_over_layers_and_the_per_layer_logit_error(tmp_path) -> None:
    import pandas as pd

    rows = [{"layer": layer, "method": method, "seed": seed, "key_error": 0.1, "value_error": 0.2,
             "logit_error_std": (10.0 if layer == 0 else 1.0) * scale + seed, "output_error": 0.3, "memory_ratio": 0.25}
            for method, scale in (("a", 1.0), ("b", 0.0)) for seed in (0, 2) for layer in range(3)]
    rows += [{"layer": layer, "method": "c", "seed": None, "key_error": 0.1, "value_error": 0.2, "logit_error_std": 1.0,
              "output_error": 0.3, "memory_ratio": 0.25} for layer in range(3)]   # run once (no rotation seed)
    path = tmp_path / "errors.md"
    kv_attention_error.write_summary(pd.DataFrame(rows), path, "title")
    text = path.read_text()
    # method a: per-seed layer means (12/3 + 0, 12/3 + 2) = (4, 6) -> 5 ± 1; method b: (0, 2) -> 1 ± 1
    assert "| a | 2 | 0.100 ± 0.000 | 0.200 ± 0.000 | 5.000 ± 1.000 |" in text
    assert "| b | 2 | 0.100 ± 0.000 | 0.200 ± 0.000 | 1.000 ± 1.000 |" in text
    assert "| c | 1 | 0.100 | 0.200 | 1.000 | 0.300 | 0.250 |" in text   # one run: no standard error shown
    assert "| 0 | 11.000 | 1.000 | 1.000 |" in text and "| 2 | 2.000 | 1.000 | 1.000 |" in text


def test_key_statistics_find_an_outlier_channel() -> None:
    keys = torch.ones(1, 2, 10, 8)
    keys[0, 1, :, 3] = 50.0                       # head 1, channel 3: 50x the median channel
    stats = kv_attention_error.key_statistics([{"keys": keys}, {"keys": torch.ones(1, 2, 10, 8)}])
    assert stats.loc[0, "channel_peak_ratio"] == 50.0 and stats.loc[1, "channel_peak_ratio"] == 1.0
    assert abs(stats.loc[1, "key_norm"] - 8 ** 0.5) < 1e-6


def test_append_keeps_rows_of_the_same_prompt_and_refuses_other_prompts(tmp_path) -> None:
    path = tmp_path / "rows.csv"
    assert kv_attention_error.stored_rows(path, context=2048, depth=0.5, queries=64) is None
    import pandas as pd

    pd.DataFrame({"layer": [0, 1], "method": ["a", "a"], "context": 2048, "depth": 0.5, "queries": 64}).to_csv(path)
    assert len(kv_attention_error.stored_rows(path, context=2048, depth=0.5, queries=64)) == 2
    with pytest.raises(SystemExit, match="other prompt options"):
        kv_attention_error.stored_rows(path, context=1536, depth=0.5, queries=64)
    pd.DataFrame({"layer": [0], "method": ["a"]}).to_csv(path)  # rows that do not say which prompt made them
    with pytest.raises(SystemExit, match="not recorded"):
        kv_attention_error.stored_rows(path, context=2048, depth=0.5, queries=64)


def test_captured_queries_are_the_projected_and_rotated_hidden_states(captured) -> None:
    """The queries the attention function received equal q_proj + RoPE of the layer's input, recomputed here."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    model, layers, ids = captured
    inputs: dict[int, tuple] = {}
    hooks = [layer.self_attn.register_forward_pre_hook(
        lambda module, args, kwargs: inputs.__setitem__(module.layer_idx, (kwargs["hidden_states"],
                                                                           kwargs["position_embeddings"])),
        with_kwargs=True) for layer in model.model.layers]
    try:
        with torch.inference_mode():
            model(input_ids=ids)
    finally:
        for hook in hooks:
            hook.remove()
    with torch.inference_mode():
        for index, attn in enumerate(layer.self_attn for layer in model.model.layers):
            hidden, (cos, sin) = inputs[index]
            q = attn.q_proj(hidden[:, -16:]).view(1, 16, -1, attn.head_dim).transpose(1, 2)
            q, _ = apply_rotary_pos_emb(q, q, cos[:, -16:], sin[:, -16:])
            torch.testing.assert_close(layers[index]["queries"], q.float(), rtol=1e-5, atol=1e-5)
