"""A tiny randomly initialised Llama-architecture model (built from a config, nothing downloaded)."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

HEAD_DIM = 64  # as SmolLM2-135M and Qwen2.5-0.5B


def tiny_llama_config(**overrides) -> "transformers.LlamaConfig":
    settings = dict(
        vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=HEAD_DIM, max_position_embeddings=2048, initializer_range=0.1,
    )
    settings.update(overrides)
    return transformers.LlamaConfig(**settings)


@pytest.fixture(autouse=True)
def single_thread():
    """Run single-threaded: on a shared 2-core machine two torch threads per process thrash (40x slower)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def tiny_config():
    return tiny_llama_config()


@pytest.fixture(scope="session")
def tiny_model(tiny_config):
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        return transformers.LlamaForCausalLM(tiny_config).eval()
    finally:
        torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def prompt_ids():
    generator = torch.Generator().manual_seed(1)
    return torch.randint(0, 256, (1, 300), generator=generator)


def next_token_logits(model, ids: torch.Tensor, cache) -> torch.Tensor:
    """Prefill ``ids[:, :-1]`` into ``cache``, then decode the last token through it."""
    from turboquant.kvcache import attach

    with torch.no_grad(), attach(model, cache):
        model(ids[:, :-1], past_key_values=cache)
        return model(ids[:, -1:], past_key_values=cache).logits[0, -1]


def relative_error(estimate: torch.Tensor, reference: torch.Tensor) -> float:
    return float((estimate - reference).norm() / reference.norm())
