"""Helpers for the KV-cache tests: a tiny Llama config, the logits of one decode step, relative errors."""

from __future__ import annotations

import contextlib

import torch
import transformers

HEAD_DIM = 64  # as SmolLM2-135M and Qwen2.5-0.5B


def tiny_llama_config(**overrides) -> transformers.LlamaConfig:
    """A 3-layer Llama with 4 query / 2 KV heads of dimension 64; weights drawn at std 0.1 so attention is peaked."""
    settings = dict(
        vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=HEAD_DIM, max_position_embeddings=2048, initializer_range=0.1,
    )
    settings.update(overrides)
    return transformers.LlamaConfig(**settings)


def next_token_logits(model, ids: torch.Tensor, cache) -> torch.Tensor:
    """Prefill ``ids[:, :-1]`` into ``cache``, then decode the last token through it (the compressed store)."""
    from turboquant.kvcache import CompressedCache, attach

    attached = attach(model, cache) if isinstance(cache, CompressedCache) else contextlib.nullcontext()
    with torch.no_grad(), attached:
        model(ids[:, :-1], cache=cache)
        return model(ids[:, -1:], cache=cache).logits[0, -1]


def relative_error(estimate: torch.Tensor, reference: torch.Tensor) -> float:
    return float((estimate - reference).norm() / reference.norm())
