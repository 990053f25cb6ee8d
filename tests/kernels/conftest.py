"""Kernel tests run Triton's CPU interpreter unless a CUDA GPU is present.

``TRITON_INTERPRET`` is read when a kernel is decorated, so it is set here, before any test module
imports ``turboquant.kernels``. Sizes are small and awkward (dims that are not powers of two, partial
tiles, partial last groups) so that masking is exercised.
"""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

pytest.importorskip("triton")


@pytest.fixture
def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture
def generator() -> torch.Generator:
    return torch.Generator().manual_seed(1234)
