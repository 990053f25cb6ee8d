"""Scores from packed keys (attention logits / inner products) against the float64 reference."""
import pytest
import torch

import turboquant as tq
from turboquant.kernels.scores import mse_scores_reference, mse_scores_triton


def random_keys(batch, n, dim, bits, generator, device):
    codes = tq.pack_codes(torch.randint(0, 2 ** bits, (batch, n, dim), generator=generator), bits)
    norms = (torch.rand(batch, n, generator=generator) * 5 + 0.1).to(torch.float16)
    return codes.to(device), norms.to(device)


def rel_err(out, ref):
    return float((out.double() - ref).norm() / ref.norm())


@pytest.mark.parametrize("batch, m, n, dim, bits", [
    (2, 4, 77, 128, 4),     # GQA group of 4 query heads, partial key tile
    (1, 20, 50, 40, 3),     # 20 queries (one padded 32-row block), 3-bit 3-byte groups
    (3, 5, 33, 300, 2),
    (1, 3, 100, 64, 1),
    (1, 2, 19, 600, 4),     # 300 groups: several group chunks per key tile
])
@pytest.mark.parametrize("decoder", ["table", "select"])
def test_matches_reference(device, generator, batch, m, n, dim, bits, decoder):
    """The table gather and the register codebook (sign + magnitude select tree) agree with float64."""
    cb = tq.lloyd_max_codebook(dim, bits)
    centroids = cb.centroids_tensor(device)
    codes, norms = random_keys(batch, n, dim, bits, generator, device)
    q_rot = torch.randn(batch, m, dim, generator=generator).to(device)
    out = mse_scores_triton(q_rot, codes, norms, centroids, bits, scale=0.3, decoder=decoder)
    ref = mse_scores_reference(q_rot, codes, norms, centroids, bits, scale=0.3)
    assert out.shape == (batch, m, n) and out.dtype == torch.float32
    assert rel_err(out, ref) < 2e-3


def test_strided_cache_slice_and_bf16_output(device, generator):
    """Keys may be a slice of a larger cache (strided key axis); bf16 output rounds at bf16 level."""
    dim, bits = 128, 4
    centroids = tq.lloyd_max_codebook(dim, bits).centroids_tensor(device)
    codes, norms = random_keys(2, 90, dim, bits, generator, device)
    codes, norms = codes[:, 5:70:2], norms[:, 5:70:2]
    q_rot = torch.randn(2, 4, dim, generator=generator).to(device)
    ref = mse_scores_reference(q_rot, codes, norms, centroids, bits)
    assert rel_err(mse_scores_triton(q_rot, codes, norms, centroids, bits, block_n=16), ref) < 2e-3
    out = mse_scores_triton(q_rot, codes, norms, centroids, bits, out_dtype=torch.bfloat16)
    assert out.dtype == torch.bfloat16 and rel_err(out, ref) < 1e-2


def test_agrees_with_library_inner_product(device, generator):
    """The kernel's scores equal TurboQuantMSE.inner_product on the library's own codes."""
    quantizer = tq.TurboQuantMSE(72, 3, rotation="hadamard", seed=2)
    x = torch.randn(45, 72, generator=generator)
    y = torch.randn(6, 72, generator=generator)
    qv = quantizer.quantize(x)
    expected = quantizer.inner_product(y, qv)
    q_rot = quantizer.rotation.apply(y)
    out = mse_scores_triton(q_rot[None].to(device), qv.codes[None].to(device), qv.norms[None].to(device),
                            quantizer.codebook.centroids_tensor(device), 3)
    assert rel_err(out[0].cpu(), expected.double()) < 2e-3


def test_bad_inputs_raise(device):
    centroids = tq.lloyd_max_codebook(32, 4).centroids_tensor(device)
    q = torch.zeros(1, 2, 32, device=device)
    codes = torch.zeros(1, 5, 16, dtype=torch.uint8, device=device)
    norms = torch.ones(1, 5, device=device)
    with pytest.raises(ValueError, match="bytes per row"):
        mse_scores_triton(q, codes[..., :15], norms, centroids, 4)
    with pytest.raises(ValueError, match="norms"):
        mse_scores_triton(q, codes, norms[:, :4], centroids, 4)
    with pytest.raises(ValueError, match="centroids"):
        mse_scores_triton(q, codes, norms, centroids[:8], 4)
    with pytest.raises(ValueError, match="expected q_rot"):
        mse_scores_triton(q[0], codes, norms, centroids, 4)
