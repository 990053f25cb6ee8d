"""Fused TurboQuant_mse quantize kernel against the float64 reference and the library quantizer."""
import numpy as np
import pytest
import torch

import turboquant as tq
from turboquant.kernels.quantize import (
    nearest_centroid_table,
    quantize_mse_reference,
    quantize_mse_triton,
)

TIE = 2e-3  # |y - midpoint| below which fp16 operands may pick the neighbouring centroid


def assert_codes_match(codes, ref_codes, y, boundaries, bits, dim):
    got = tq.unpack_codes(codes.cpu(), bits, dim).long()
    want = tq.unpack_codes(ref_codes.cpu(), bits, dim).long()
    wrong = got != want
    gap = (y.cpu()[..., None] - torch.as_tensor(boundaries)).abs().min(dim=-1).values
    assert not (wrong & (gap > TIE)).any(), "a code differs away from a midpoint"
    assert ((got - want).abs() <= 1).all(), "a code differs by more than one level"
    assert wrong.double().mean() < 0.01
    # spare bits of the last byte are zero, exactly as the library packs
    assert torch.equal(tq.pack_codes(got, bits), codes.cpu())


@pytest.mark.parametrize("dim, bits, dtype, n", [
    (128, 4, torch.float16, 70),      # the KV-cache shape, partial row tile
    (40, 3, torch.float32, 33),       # 3-bit groups of 3 bytes, dim not a power of two
    (100, 3, torch.float32, 9),       # partial last group: spare bits must stay zero
    (300, 2, torch.bfloat16, 17),     # dim > 256: chunked rotation path
    (64, 1, torch.float16, 20),
    (64, 2, torch.float16, 20),       # (the tree's 2-bit case; 4 and 3 bits above)
])
@pytest.mark.parametrize("nearest", ["table", "tree"])
def test_matches_reference(device, generator, dim, bits, dtype, n, nearest):
    """The cell-table gather and the midpoint tree (sign + binary search of |y|) give the reference's codes."""
    cb = tq.lloyd_max_codebook(dim, bits)
    rotation = tq.make_rotation("haar", dim, seed=3).matrix().to(device)
    x = (3 * torch.randn(n, dim, generator=generator)).to(dtype).to(device)
    codes, norms = quantize_mse_triton(x, rotation, cb.boundaries, bits, nearest=nearest)
    ref_codes, ref_norms, y = quantize_mse_reference(x, rotation, cb.boundaries, bits)
    assert codes.shape == ref_codes.shape and codes.dtype == torch.uint8
    assert_codes_match(codes, ref_codes, y, cb.boundaries, bits, dim)
    torch.testing.assert_close(norms.double(), ref_norms, rtol=1e-6, atol=0)


def test_leading_dims_zero_vectors_and_fp16_norms(device, generator):
    dim, bits = 128, 4
    cb = tq.lloyd_max_codebook(dim, bits)
    rotation = tq.make_rotation("hadamard", dim, seed=0).matrix().to(device)
    x = torch.randn(3, 5, dim, generator=generator).to(device)
    x[1, 2] = 0
    codes, norms = quantize_mse_triton(x, rotation, cb.boundaries, bits, norms_dtype=torch.float16)
    assert codes.shape == (3, 5, 64) and norms.shape == (3, 5) and norms.dtype == torch.float16
    assert norms[1, 2] == 0
    ref_codes, ref_norms, y = quantize_mse_reference(x, rotation, cb.boundaries, bits)
    keep = ref_norms > 0
    assert_codes_match(codes[keep], ref_codes[keep], y[keep], cb.boundaries, bits, dim)
    torch.testing.assert_close(norms.double(), ref_norms, rtol=1e-3, atol=0)


def test_agrees_with_library_quantizer(device, generator):
    """Same codes as TurboQuantMSE.quantize (up to ties), so the classes can dispatch to the kernel."""
    quantizer = tq.TurboQuantMSE(96, 4, rotation="haar", seed=7)
    x = torch.randn(41, 96, generator=generator)
    qv = quantizer.quantize(x)
    codes, norms = quantize_mse_triton(x.to(device), quantizer.rotation.matrix().to(device),
                                       quantizer.codebook.boundaries, 4)
    y = quantizer.rotation.apply(x / x.norm(dim=-1, keepdim=True)).double()
    assert_codes_match(codes, qv.codes, y, quantizer.codebook.boundaries, 4, 96)
    torch.testing.assert_close(norms.cpu(), qv.norms, rtol=1e-6, atol=0)


def test_nearest_centroid_table_is_exact_off_ties():
    """The cell table reproduces #{k: y > t_k} for y across [-1, 1], midpoints +- 1e-6 included."""
    for dim, bits in [(128, 4), (1536, 4), (64, 2), (200, 3), (32, 1)]:
        bnd = tq.lloyd_max_codebook(dim, bits).boundaries
        table, scale, offset = nearest_centroid_table(bnd)
        rng = np.random.default_rng(dim + bits)
        y = np.concatenate([rng.uniform(-1, 1, 20000), rng.normal(0, dim ** -0.5, 20000),
                            bnd - 1e-6, bnd + 1e-6, [-1.0, 1.0, 0.0]]).astype(np.float32)
        cell = ((y * np.float32(scale) + np.float32(offset)).astype(np.float32).view(np.int32)
                & (table.numel() - 1))
        entry = table.numpy()[cell]
        threshold = (entry & ~np.int32(15)).view(np.float32)
        codes = (entry & 15) + (y > threshold)
        np.testing.assert_array_equal(codes, np.searchsorted(bnd, y.astype(np.float64), side="left"))


def test_bad_inputs_raise(device):
    cb = tq.lloyd_max_codebook(16, 2)
    rotation = torch.eye(16, device=device)
    with pytest.raises(ValueError, match="float16, bfloat16 or float32"):
        quantize_mse_triton(torch.ones(2, 16, dtype=torch.int32, device=device), rotation, cb.boundaries, 2)
    with pytest.raises(ValueError, match="rotation_matrix"):
        quantize_mse_triton(torch.ones(2, 16, device=device), torch.eye(8, device=device), cb.boundaries, 2)
    with pytest.raises(ValueError, match="boundaries"):
        quantize_mse_triton(torch.ones(2, 16, device=device), rotation, cb.boundaries, 3)
    with pytest.raises(ValueError, match="bits"):
        quantize_mse_triton(torch.ones(2, 16, device=device), rotation, tq.lloyd_max_codebook(16, 5).boundaries, 5)




def test_tree_needs_symmetric_midpoints(device, generator):
    x = torch.randn(4, 16, generator=generator).to(device)
    rotation = tq.make_rotation("haar", 16, seed=0).matrix().to(device)
    with pytest.raises(ValueError, match="symmetric"):
        quantize_mse_triton(x, rotation, np.array([-0.2, 0.0, 0.1]), 2, nearest="tree")
    with pytest.raises(ValueError, match="nearest must be"):
        quantize_mse_triton(x, rotation, tq.lloyd_max_codebook(16, 2).boundaries, 2, nearest="bucket")
