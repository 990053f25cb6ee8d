"""Fused decode attention (packed store read by the Triton kernel) against the workspace path.

On the CPU the kernel runs in Triton's interpreter (``TRITON_INTERPRET=1``, set before the kernels are
imported), so these tests exercise the same kernel code the GPU runs, at tiny sizes; on a CUDA machine the model
and prompts move to the GPU and the compiled kernel runs.
"""
import copy
import os

import pytest
import torch

import turboquant as tq

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
pytest.importorskip("triton")

from tests.kvcache.tiny_llama import relative_error
from turboquant.kvcache import attach, build_cache
from turboquant.kvcache import fused_attention
from turboquant.kvcache.attention import CACHE_ATTENTION
from turboquant.kvcache.turboquant_cache import TurboQuantCacheConfig, TurboQuantLayer

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
PROMPT = 70  # tokens prefilled; the kernel then reads them from the packed store
STEPS = 3


@pytest.fixture(scope="module")
def tiny_model(tiny_model):
    """The shared tiny Llama, on the device the kernel runs on (a copy: the session fixture stays on the CPU)."""
    return copy.deepcopy(tiny_model).to(DEVICE)


@pytest.fixture(scope="module")
def prompt_ids(prompt_ids):
    return prompt_ids.to(DEVICE)


def greedy(model, ids, cache, fused: bool):
    """Prefill ``ids`` then ``STEPS`` greedy decode steps; returns (logits of every decode step, tokens)."""
    context = attach(model, cache) if fused else torch.no_grad()
    logits, tokens = [], []
    with torch.no_grad(), context:
        out = model(ids, cache=cache)
        for _ in range(STEPS):
            token = out.logits[:, -1:].argmax(-1)
            tokens.append(token)
            out = model(token, cache=cache)
            logits.append(out.logits[:, -1].float())
    return torch.stack(logits), torch.cat(tokens, dim=-1)


@pytest.mark.parametrize("options, batch", [
    ({"key_bits": 4, "value_bits": 4}, 1),                                          # every token quantized at once
    ({"key_bits": 3, "value_bits": 2, "residual_length": 16, "center_keys": True}, 1),  # window + key mean restored
    ({"key_bits": 4, "value_bits": 3, "boundary_layers": 1, "rotation": "hadamard"}, 2),  # fp16 layers 0 and 2
    ({"bits": 3.5, "residual_length": 16}, 2),           # outlier split (16 + 48 channels), per-row channel orders
    ({"key_variant": "prod"}, 1),                        # TurboQuant_prod keys: 3-bit MSE + QJL sign bits
    ({"bits": 3.5, "key_variant": "prod", "center_keys": True}, 1),  # split + prod + key mean restored
    ({"bits": 3.5, "residual_length": 16, "sink_tokens": 4}, 2),  # 16-bit sink tokens join the exact part
])
def test_fused_matches_workspace_path(tiny_model, prompt_ids, options, batch, kernel_reads):
    ids = torch.cat([prompt_ids[:, :PROMPT], prompt_ids[:, 150:150 + PROMPT]])[:batch]
    reference = build_cache("turboquant", tiny_model.config, **options)
    fused = build_cache("turboquant", tiny_model.config, fused_decode=True, **options)
    ref_logits, ref_tokens = greedy(tiny_model, ids, reference, fused=False)
    got_logits, got_tokens = greedy(tiny_model, ids, fused, fused=True)
    quantized_layers = sum(isinstance(layer, TurboQuantLayer) and layer.read_path == "fused" for layer in fused.layers)
    assert quantized_layers == tiny_model.config.num_hidden_layers - 2 * options.get("boundary_layers", 0)
    assert len(kernel_reads) == STEPS * quantized_layers  # every decode step of a quantized layer read the kernel
    assert torch.equal(got_tokens, ref_tokens)
    # fp16 operands in the kernel vs the float32 workspace. With QJL keys the error depends on the draw of S
    # (key_variant="prod", seeds 0-3: 0.0006 to 0.025), so those configurations get a wider tolerance; a wrong
    # kernel is off by O(1).
    tolerance = 5e-2 if options.get("key_variant") == "prod" else 5e-3
    assert relative_error(got_logits, ref_logits) < tolerance
    assert fused.nbytes() == reference.nbytes() == fused.expected_nbytes()
    assert all(layer.key_stream.workspace is None for layer in fused.layers
               if isinstance(layer, TurboQuantLayer))  # nothing materialised


def test_padded_batch_takes_the_torch_path(tiny_model, prompt_ids):
    """A left-padded row hides cached tokens: the step is answered by decode + sdpa, matching the workspace path."""
    ids = torch.cat([prompt_ids[:, :40], prompt_ids[:, 100:140]])
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    outputs = []
    for cache, fused in ((build_cache("turboquant", tiny_model.config), False),
                         (build_cache("turboquant", tiny_model.config, fused_decode=True), True)):
        context = attach(tiny_model, cache) if fused else torch.no_grad()
        with torch.no_grad(), context:
            tiny_model(ids, attention_mask=mask, cache=cache)
            step_mask = torch.cat([mask, torch.ones(2, 1, dtype=mask.dtype, device=mask.device)], dim=-1)
            outputs.append(tiny_model(ids[:, -1:], attention_mask=step_mask, cache=cache).logits.float())
    assert relative_error(outputs[1], outputs[0]) < 1e-5


def test_unsupported_configurations_name_the_reason(tiny_model):
    """Only MSE code widths above the kernels' 4 bits remain (TurboQuant_prod keys store bits - 1 of them)."""
    served = [
        TurboQuantCacheConfig(), TurboQuantCacheConfig(key_variant="prod", key_bits=5),
        TurboQuantCacheConfig(key_bits=3, value_bits=3, outlier_channels=16),                    # outliers at 4 bits
        TurboQuantCacheConfig(key_bits=4, value_bits=3, key_variant="prod", outlier_channels=16),  # 5-bit prod
        TurboQuantCacheConfig(key_bits=1, value_bits=2, key_variant="prod", outlier_channels=16),  # QJL alone
        TurboQuantCacheConfig(outlier_channels=16, value_outliers=False, outlier_key_bits=4),
    ]
    assert all(config.read_path().chosen == "fused" for config in served)
    assert "value_bits=6" in TurboQuantCacheConfig(value_bits=6).read_path().why_not("fused")
    assert "key_bits=6 (5-bit MSE codes + QJL signs)" in TurboQuantCacheConfig(
        key_variant="prod", key_bits=6).read_path().why_not("fused")
    assert "outlier_value_bits=5" in TurboQuantCacheConfig(key_bits=3, outlier_channels=16).read_path().why_not("fused")
    with pytest.raises(ValueError, match="outlier_key_bits=5"):
        build_cache("turboquant", tiny_model.config, fused_decode=True, bits=4.5)


def test_attention_implementation_is_restored(tiny_model):
    before = tiny_model.config._attn_implementation
    cache = build_cache("turboquant", tiny_model.config, fused_decode=True)
    with attach(tiny_model, cache):
        assert tiny_model.config._attn_implementation == f"{CACHE_ATTENTION}_{before}"
    assert tiny_model.config._attn_implementation == before


def test_a_step_no_attention_function_read_fails_loudly(tiny_model, prompt_ids):
    """If the model's attention bypasses the registered function, the unread packed part raises, never silently
    attending over the window alone."""
    cache = build_cache("turboquant", tiny_model.config, fused_decode=True)
    with torch.no_grad():
        tiny_model(prompt_ids[:, :20], cache=cache)
        with pytest.raises(RuntimeError, match="no attention call read the packed part"), attach(tiny_model, cache):
            tiny_model.set_attn_implementation("sdpa")  # as a model with its own attention dispatch would
            tiny_model(prompt_ids[:, 20:21], cache=cache)


@pytest.mark.parametrize("make", [
    lambda: tq.TurboQuantMSE(32, 3, rotation="haar", seed=1),
    lambda: tq.TurboQuantMSE(32, 2, rotation="hadamard", seed=2),
    lambda: tq.TurboQuantProd(32, 3, seed=3),
    lambda: tq.TurboQuantProd(32, 1, seed=4),  # QJL alone
])
def test_the_kernel_format_is_read_off_the_score_stages(make):
    """``_channel_group`` builds the kernel's description from the quantizer's score stages: the same Pi, codebook,
    S and scale as the quantizer's own attributes."""
    quantizer = make()
    group = fused_attention._channel_group(quantizer)
    assert group.bits == quantizer.mse_bits
    if quantizer.mse_bits:
        torch.testing.assert_close(group.rotation, quantizer.rotation.matrix())
        torch.testing.assert_close(group.centroids, quantizer.codebook.centroids_tensor())
    else:
        assert group.rotation is None and group.centroids is None
    if isinstance(quantizer, tq.TurboQuantProd):
        torch.testing.assert_close(group.sketch, quantizer.qjl.matrix)
        assert group.qjl_scale == quantizer.qjl.scale
    else:
        assert group.sketch is None and group.qjl_scale is None
