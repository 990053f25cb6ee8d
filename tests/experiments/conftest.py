"""Experiment tests check the experiments' own code; the Triton kernels are the kernel and KV-cache tests' job.

``tests/kernels/conftest.py`` sets ``TRITON_INTERPRET=1`` for the whole pytest process (a kernel reads it when it
is decorated), and on the CPU that makes every fused-decode KV cache run its kernel in Triton's interpreter: the
needle smoke test took 467 s so, 24 s without. Each experiment test therefore runs with it unset, and the caches
take their workspace read path (``TurboQuantCacheConfig.read_path`` says why).
"""

import pytest


@pytest.fixture(autouse=True)
def _no_triton_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
