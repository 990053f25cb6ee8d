"""Fixtures: a tiny randomly initialised Llama-architecture model (built from a config, nothing downloaded)."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from tests.kvcache.tiny_llama import tiny_llama_config  # noqa: E402


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
    return torch.randint(0, 256, (1, 300), generator=torch.Generator().manual_seed(1))


@pytest.fixture
def kernel_reads(monkeypatch) -> list:
    """A list that grows by one entry per call of ``fused_attention.packed_attention`` (the fused read path's
    kernel call) while the test runs."""
    from turboquant.kvcache import fused_attention

    calls = []
    original = fused_attention.packed_attention

    def counting(*args):
        calls.append(1)
        return original(*args)

    monkeypatch.setattr(fused_attention, "packed_attention", counting)
    return calls
