"""The package's entry points and the availability check used for backend dispatch."""
import os

import pytest
import torch

from turboquant import kernels


def test_entry_points_resolve_to_the_op_modules():
    from turboquant.kernels import decode_attention, quantize, quantize_prod, scores

    assert kernels.quantize_mse_triton is quantize.quantize_mse_triton
    assert kernels.quantize_prod_triton is quantize_prod.quantize_prod_triton
    assert kernels.mse_scores_triton is scores.mse_scores_triton
    assert kernels.decode_attention_triton is decode_attention.decode_attention_triton
    assert kernels.decode_attention_groups_triton is decode_attention.decode_attention_groups_triton
    with pytest.raises(AttributeError):
        getattr(kernels, "no_such_kernel")  # noqa: B009 - the module __getattr__ is what is tested


def test_triton_available():
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    assert kernels.triton_available("cpu") == interpreted
    assert kernels.triton_available("cuda") == (interpreted or torch.cuda.is_available())


def test_cpu_tensors_without_interpreter_raise(monkeypatch):
    from turboquant.kernels._layout import check_device

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="CUDA device"):
        check_device(torch.device("cpu"))
