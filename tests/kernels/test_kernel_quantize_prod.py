"""Fused TurboQuant_prod quantize kernel against the float64 reference and TurboQuantProd.quantize."""
import pytest
import torch

import turboquant as tq
from turboquant.kernels.quantize_prod import (
    quantize_prod_reference,
    quantize_prod_triton,
)

TIE = 2e-3


def assert_close_off_ties(got_packed, want_packed, bits, dim, margin):
    """Unpacked codes equal except where ``margin`` (distance to the decision point) is below TIE."""
    got = tq.unpack_codes(got_packed.cpu(), bits, dim).long()
    want = tq.unpack_codes(want_packed.cpu(), bits, dim).long()
    wrong = got != want
    assert not (wrong & (margin.cpu() > TIE)).any()
    assert wrong.double().mean() < 0.02
    assert torch.equal(tq.pack_codes(got, bits), got_packed.cpu())  # spare bits zero


@pytest.mark.parametrize("dim, bits, n", [(128, 4, 37), (100, 3, 21), (40, 2, 9), (64, 1, 12), (64, 5, 12)])
@pytest.mark.parametrize("nearest", ["table", "tree"])
def test_matches_library_quantizer(device, generator, dim, bits, n, nearest):
    quantizer = tq.TurboQuantProd(dim, bits, rotation="haar", seed=4)
    x = 2 * torch.randn(n, dim, generator=generator)
    qv = quantizer.quantize(x)
    mse = quantizer.mse
    args = ((mse.rotation.matrix().to(device), mse.codebook.boundaries, mse.codebook.centroids_tensor(device))
            if mse else (None, None, None))
    codes, signs, norms, residual_norms = quantize_prod_triton(x.to(device), *args, bits - 1,
                                                               quantizer.qjl.matrix.to(device), nearest=nearest)
    ref = quantize_prod_reference(x, *(a.cpu() if isinstance(a, torch.Tensor) else a for a in args), bits - 1,
                                  quantizer.qjl.matrix)
    assert codes.shape == qv.codes.shape and signs.shape == qv.qjl_signs.shape
    if mse:
        gap = (ref["y"][..., None] - torch.as_tensor(mse.codebook.boundaries)).abs().min(dim=-1).values
        assert_close_off_ties(codes, qv.codes, bits - 1, dim, gap)
    # a code that moved at a tie changes the residual: compare signs only on rows with identical codes
    same_rows = (codes.cpu() == qv.codes).all(dim=-1)
    margin = ref["sketch"].abs() / ref["residual_norms"][:, None].clamp_min(1e-12)
    assert_close_off_ties(signs[same_rows], qv.qjl_signs[same_rows], 1, dim, margin[same_rows] / dim ** 0.5)
    torch.testing.assert_close(norms.cpu(), qv.norms, rtol=1e-6, atol=0)
    torch.testing.assert_close(residual_norms.cpu()[same_rows], qv.residual_norms[same_rows], rtol=1e-2, atol=1e-4)


def test_rejects_large_dims_and_bad_codebooks(device):
    with pytest.raises(ValueError, match="dim <= 256"):
        quantize_prod_triton(torch.ones(2, 300, device=device), None, None, None, 0, torch.eye(300, device=device))
    cb = tq.lloyd_max_codebook(16, 2)
    with pytest.raises(ValueError, match="boundaries"):
        quantize_prod_triton(torch.ones(2, 16, device=device), torch.eye(16, device=device), cb.boundaries,
                             cb.centroids_tensor(device), 3, torch.eye(16, device=device))
