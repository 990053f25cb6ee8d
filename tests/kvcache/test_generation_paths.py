"""experiments.kv_generation.generate_with_cache picks the fused decode path when the kernel serves the cache on
the model's device, records which path ran, and gives the same tokens as the workspace path.

On the CPU the kernel runs in Triton's interpreter (``TRITON_INTERPRET=1``, set before the kernels are used).
"""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
pytest.importorskip("triton")

from experiments.kv_generation import generate_with_cache
from experiments.models import LoadedModel, ModelSpec
from turboquant.kvcache import build_cache
from turboquant.kvcache.turboquant_cache import TurboQuantCacheConfig

NEW_TOKENS = 4
pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="the tiny model runs on the CPU, where the kernel needs the interpreter")


class DigitTokenizer:
    """The two things generate_with_cache asks of a tokenizer: a pad id and decode (no end-of-sequence token)."""

    pad_token_id = 0

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return " ".join(str(i) for i in ids)


@pytest.fixture(scope="module")
def loaded(tiny_model):
    return LoadedModel(model=tiny_model, tokenizer=DigitTokenizer(),
                       spec=ModelSpec(name="tiny", display_name="tiny random Llama", pretrained="unused"))


def generate(loaded, prompt_ids, method, options):
    return generate_with_cache(loaded, prompt_ids[:, :60], method, options, NEW_TOKENS, min_new_tokens=NEW_TOKENS)


def test_fused_path_runs_and_matches_the_workspace_path(loaded, prompt_ids, kernel_reads):
    options = {"key_bits": 4, "value_bits": 3, "residual_length": 16}
    implementation = loaded.model.config._attn_implementation
    fused = generate(loaded, prompt_ids, "turboquant", options)
    workspace = generate(loaded, prompt_ids, "turboquant", {**options, "fused_decode": False})
    assert (fused.attention_path, workspace.attention_path) == ("fused", "workspace")
    layers = loaded.model.config.num_hidden_layers
    assert len(kernel_reads) == (NEW_TOKENS - 1) * layers  # every decode step of every layer read the packed store
    assert fused.text == workspace.text and fused.new_token_count == NEW_TOKENS
    assert fused.cache_nbytes == workspace.cache_nbytes and fused.memory_ratio == workspace.memory_ratio
    assert fused.cache_allocated_nbytes >= fused.cache_nbytes
    assert loaded.model.config._attn_implementation == implementation  # restored after generation


@pytest.mark.parametrize("options", [
    {"bits": 3.5, "residual_length": 16},   # outlier split (two channel groups per vector), as turboquant_3p5_window
    {"bits": 3.5, "key_variant": "prod"},   # split + QJL sign bits of the residual, as turboquant_3p5_prod
])
def test_split_and_prod_caches_take_the_fused_path(loaded, prompt_ids, options):
    fused = generate(loaded, prompt_ids, "turboquant", options)
    workspace = generate(loaded, prompt_ids, "turboquant", {**options, "fused_decode": False})
    assert (fused.attention_path, workspace.attention_path) == ("fused", "workspace")
    assert fused.text == workspace.text and fused.cache_nbytes == workspace.cache_nbytes


@pytest.mark.parametrize("method, options", [
    ("turboquant", {"bits": 6}),                        # 6-bit codes: the kernels implement 1-4
    ("kivi", {"bits": 4, "residual_length": 32}),       # not TurboQuant codes
])
def test_caches_the_kernel_does_not_serve_take_the_workspace_path(loaded, prompt_ids, method, options):
    assert generate(loaded, prompt_ids, method, options).attention_path == "workspace"


def test_forcing_the_fused_path_never_falls_back_silently(loaded, prompt_ids):
    with pytest.raises(ValueError, match="key_bits=6"):
        generate(loaded, prompt_ids, "turboquant", {"bits": 6, "fused_decode": True})
    with pytest.raises(ValueError, match="decode_fn"):
        build_cache("turboquant", loaded.model.config, bits=4, fused_decode=True, decode_fn=lambda e, f: e.decode(f))


def test_reasons_the_fused_path_is_unavailable(monkeypatch):
    assert TurboQuantCacheConfig().read_path("auto", "cpu").chosen == "fused"  # under the interpreter
    assert TurboQuantCacheConfig(key_bits=2, value_bits=2, key_variant="prod",
                                 outlier_channels=16).read_path("auto", "cpu").chosen == "fused"
    assert "key_bits=5" in TurboQuantCacheConfig(key_bits=5, value_bits=5).read_path("auto", "cpu").why_not("fused")
    monkeypatch.delenv("TRITON_INTERPRET")
    assert "TRITON_INTERPRET=1" in TurboQuantCacheConfig().read_path("auto", "cpu").why_not("fused")


def test_auto_takes_the_fused_path_only_where_the_kernel_serves(tiny_config):
    served = build_cache("turboquant", tiny_config, bits=4, fused_decode="auto")
    unserved = build_cache("turboquant", tiny_config, bits=6, fused_decode="auto")
    assert all(layer.fused_decode for layer in served.layers) and not any(layer.fused_decode for layer in unserved.layers)
    with pytest.raises(ValueError, match="fused_decode must be one of"):
        build_cache("turboquant", tiny_config, bits=4, fused_decode="yes")
