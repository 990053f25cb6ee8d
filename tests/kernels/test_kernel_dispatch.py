"""backend="triton" in the quantizer classes gives the torch path's results (kernels under the interpreter on CPU)."""
import pytest
import torch

import turboquant as tq


def rel_err(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.mark.parametrize("dim, bits", [(96, 4), (40, 3)])
def test_mse_backends_agree(device, generator, dim, bits):
    x = torch.randn(53, dim, generator=generator)
    y = torch.randn(5, dim, generator=generator)
    fast = tq.TurboQuantMSE(dim, bits, seed=1, device=device, backend="triton")
    slow = tq.TurboQuantMSE(dim, bits, seed=1, device=device, backend="torch")
    q_fast, q_slow = fast.quantize(x), slow.quantize(x)
    assert q_fast.signature == q_slow.signature and q_fast.codes.shape == q_slow.codes.shape
    same = (q_fast.codes == q_slow.codes).all(dim=-1)
    assert same.double().mean() > 0.9  # rows differ only at fp16 ties of a midpoint
    torch.testing.assert_close(q_fast.norms, q_slow.norms, rtol=1e-6, atol=0)
    assert rel_err(fast.inner_product(y, q_slow), slow.inner_product(y, q_slow)) < 2e-3  # fp16 queries
    torch.testing.assert_close(slow.dequantize(q_fast)[same], slow.dequantize(q_slow)[same])


@pytest.mark.parametrize("dim, bits", [(64, 3), (48, 1)])
def test_prod_backends_agree(device, generator, dim, bits):
    x = torch.randn(37, dim, generator=generator)
    y = torch.randn(4, dim, generator=generator)
    fast = tq.TurboQuantProd(dim, bits, seed=2, device=device, backend="triton")
    slow = tq.TurboQuantProd(dim, bits, seed=2, device=device, backend="torch")
    q_fast, q_slow = fast.quantize(x), slow.quantize(x)
    same = (q_fast.codes == q_slow.codes).all(dim=-1) & (q_fast.qjl_signs == q_slow.qjl_signs).all(dim=-1)
    assert same.double().mean() > 0.8
    torch.testing.assert_close(q_fast.residual_norms[same], q_slow.residual_norms[same], rtol=1e-2, atol=1e-4)
    assert rel_err(fast.inner_product(y, q_slow), slow.inner_product(y, q_slow)) < 2e-3


def test_backend_validation(device):
    with pytest.raises(ValueError, match="backend must be one of"):
        tq.TurboQuantMSE(16, 2, backend="cuda")
    with pytest.raises(ValueError, match="codes are 1-4 bits, this quantizer's 6"):
        tq.TurboQuantMSE(16, 6, device=device, backend="triton")
    chosen = tq.TurboQuantMSE(16, 2, device=device, backend="auto").backend_choice.chosen
    assert (chosen == "triton") == (torch.device(device).type == "cuda")  # auto never takes the CPU interpreter
