"""Fused numba CPU encoder against the float64 reference, the torch path and the rotation it reproduces."""
import numpy as np
import pytest
import torch

import turboquant as tq
from turboquant import backends, quantizers

pytest.importorskip("numba")

from turboquant.kernels.quantize import quantize_mse_reference
from turboquant.kernels.quantize_cpu import (
    _nearest_indices,
    hadamard_rotate,
    hadamard_state,
    nearest_centroid_cells,
    quantize_mse_cpu,
)

TIE = 1e-5  # |y - midpoint| below which float32 rounding may pick the neighbouring centroid


def mismatches(codes, ref_codes, y, boundaries, bits, dim) -> int:
    """Number of differing codes; fails if one differs away from a midpoint or by more than one level."""
    got = tq.unpack_codes(codes, bits, dim).long()
    want = tq.unpack_codes(ref_codes, bits, dim).long()
    wrong = got != want
    gap = (y[..., None] - torch.as_tensor(boundaries, dtype=torch.float64)).abs().min(dim=-1).values
    assert not (wrong & (gap > TIE)).any(), "a code differs away from a midpoint"
    assert ((got - want).abs() <= 1).all(), "a code differs by more than one level"
    assert torch.equal(tq.pack_codes(got, bits), codes), "not the library's packing (spare bits must be zero)"
    return int(wrong.sum())


@pytest.mark.parametrize("dim, bits, rotation, n", [
    (1536, 4, "hadamard", 300),   # the ANN shape: 3 rounds on the leading 1024 coordinates
    (200, 3, "hadamard", 101),    # 3-bit groups of 3 bytes, block 128
    (128, 2, "hadamard", 64),     # power of two: one round, no permutation
    (100, 1, "haar", 33),         # matmul path, partial last byte
    (64, 8, "hadamard", 50),      # 255 midpoints
])
def test_matches_float64_reference(dim, bits, rotation, n):
    cb = tq.lloyd_max_codebook(dim, bits)
    rot = tq.make_rotation(rotation, dim, seed=5)
    x = 2.5 * torch.randn(n, dim, generator=torch.Generator().manual_seed(dim + bits))
    codes, norms = quantize_mse_cpu(x, rot, cb.boundaries, bits)
    ref_codes, ref_norms, y = quantize_mse_reference(x, rot.matrix(), cb.boundaries, bits)
    assert codes.shape == ref_codes.shape and codes.dtype == torch.uint8 and norms.dtype == torch.float32
    wrong = mismatches(codes, ref_codes, y, cb.boundaries, bits, dim)
    assert wrong <= max(1, 1e-4 * n * dim), f"{wrong} of {n * dim} codes differ from the float64 reference"
    torch.testing.assert_close(norms.double(), ref_norms, rtol=1e-6, atol=0)


@pytest.mark.parametrize("dim", [2, 3, 128, 200, 1536])
def test_hadamard_transform_is_the_rotation(dim):
    """The fused transform is RandomizedHadamard.apply (same signs, permutations, rounds and block)."""
    rot = tq.make_rotation("hadamard", dim, seed=11)
    x = torch.randn(37, dim, generator=torch.Generator().manual_seed(dim))
    out = np.empty((37, dim), np.float32)
    hadamard_rotate(x.numpy(), *hadamard_state(rot), out)
    torch.testing.assert_close(torch.from_numpy(out), rot.apply(x), rtol=0, atol=2e-5)
    torch.testing.assert_close(torch.from_numpy(out).double(), x.double() @ rot.matrix().double().T, rtol=0, atol=2e-5)


def test_nearest_centroid_is_exact_at_ties_and_ends():
    """The cell table reproduces torch.bucketize bit for bit: on the midpoints themselves, one float32
    ulp either side of them, at ±1 and beyond, for every code width of a real codebook."""
    for bits in range(1, 9):
        bnd = torch.as_tensor(tq.lloyd_max_codebook(1536, bits).boundaries, dtype=torch.float32)
        probes = torch.cat([bnd, torch.nextafter(bnd, torch.tensor(2.0)), torch.nextafter(bnd, torch.tensor(-2.0)),
                            torch.tensor([-1.5, -1.0, -0.0, 0.0, 1.0, 1.5]), torch.rand(2000) * 0.4 - 0.2])
        indices = np.empty(probes.numel(), np.uint8)
        _nearest_indices(probes.numpy(), *nearest_centroid_cells(bnd.numpy()), indices)
        assert torch.equal(torch.from_numpy(indices).long(), torch.bucketize(probes, bnd)), f"bits={bits}"


def test_cell_table_rejects_bad_midpoints():
    with pytest.raises(ValueError, match="sorted"):
        nearest_centroid_cells(np.array([0.1, -0.1]))
    with pytest.raises(ValueError, match="too close"):
        nearest_centroid_cells(np.array([0.1, 0.1 + 1e-7]))


@pytest.mark.parametrize("rotation", ["haar", "hadamard"])
def test_quantizer_backends_agree(rotation):
    """backend='numba' gives TurboQuantMSE.quantize's layout; Haar bit-identical, Hadamard up to ties."""
    dim, bits = 200, 4
    x = torch.randn(4, 50, dim, generator=torch.Generator().manual_seed(3)) * 7
    x[1, 3] = 0
    fast = tq.TurboQuantMSE(dim, bits, rotation=rotation, seed=2, backend="numba")
    slow = tq.TurboQuantMSE(dim, bits, rotation=rotation, seed=2, backend="torch")
    assert (fast.backend_choice.chosen, slow.backend_choice.chosen) == ("numba", "torch")
    got, want = fast.quantize(x), slow.quantize(x)
    assert got.codes.shape == want.codes.shape == (4, 50, 100) and got.signature == want.signature
    assert got.norms[1, 3] == 0
    if rotation == "haar":
        assert torch.equal(got.codes, want.codes) and torch.equal(got.norms, want.norms)
    else:
        differ = tq.unpack_codes(got.codes, bits, dim) != tq.unpack_codes(want.codes, bits, dim)
        assert int(differ.sum()) <= 2, f"{int(differ.sum())} codes differ"
        torch.testing.assert_close(got.norms, want.norms, rtol=1e-6, atol=0)
    torch.testing.assert_close(fast.dequantize(got), slow.dequantize(want), rtol=0, atol=0.2)


@pytest.mark.parametrize(("rotation", "dim", "bits"), [("haar", 100, 3), ("hadamard", 200, 4), ("hadamard", 64, 2)])
def test_prod_backends_agree(rotation, dim, bits):
    """TurboQuant_prod on the numba path (residual and QJL signs formed in the rotated basis with S Πᵀ)
    stores what the torch path stores, up to float32 ties: codes and signs of coordinates at a boundary."""
    x = 3 * torch.randn(3, 40, dim, generator=torch.Generator().manual_seed(dim))
    x[2, 5] = 0
    fast = tq.TurboQuantProd(dim, bits, rotation=rotation, seed=6, backend="numba")
    slow = tq.TurboQuantProd(dim, bits, rotation=rotation, seed=6, backend="torch")
    assert (fast.backend_choice.chosen, slow.backend_choice.chosen) == ("numba", "torch")
    got, want = fast.quantize(x), slow.quantize(x)
    for name, width in (("codes", bits - 1), ("qjl_signs", 1)):
        a, b = getattr(got, name), getattr(want, name)
        assert a.shape == b.shape and a.dtype == torch.uint8
        differ = int((tq.unpack_codes(a, width, dim) != tq.unpack_codes(b, width, dim)).sum())
        assert differ <= 2, f"{differ} {name} differ"
    assert torch.equal(got.norms, want.norms) and got.norms[2, 5] == 0
    torch.testing.assert_close(got.residual_norms, want.residual_norms, rtol=1e-5, atol=1e-6)
    y = torch.randn(4, dim, generator=torch.Generator().manual_seed(1))
    scale = float(x.norm(dim=-1).max() * y.norm(dim=-1).max())
    torch.testing.assert_close(fast.inner_product(y, got), slow.inner_product(y, want), rtol=0, atol=0.02 * scale)


def test_low_precision_inputs_and_threads():
    dim, bits = 96, 3
    x = torch.randn(70, dim, generator=torch.Generator().manual_seed(8)).to(torch.bfloat16)
    rot = tq.make_rotation("hadamard", dim, seed=0)
    bnd = tq.lloyd_max_codebook(dim, bits).boundaries
    one, norms_one = quantize_mse_cpu(x, rot, bnd, bits, threads=1)
    two, norms_two = quantize_mse_cpu(x, rot, bnd, bits, threads=2)
    assert torch.equal(one, two) and torch.equal(norms_one, norms_two)
    ref_codes, _, y = quantize_mse_reference(x.float(), rot.matrix(), bnd, bits)
    mismatches(one, ref_codes, y, bnd, bits, dim)
    with pytest.raises(ValueError, match="threads"):
        quantize_mse_cpu(x, rot, bnd, bits, threads=0)
    with pytest.raises(ValueError, match="midpoints"):
        quantize_mse_cpu(x, rot, bnd[:-1], bits)
    with pytest.raises(ValueError, match="last dimension"):
        quantize_mse_cpu(x[:, :-1], rot, bnd, bits)


def test_dispatch(monkeypatch):
    assert tq.TurboQuantMSE(16, 2, backend="auto").backend_choice.chosen == "numba"  # CPU + numba installed
    assert tq.TurboQuantMSE(16, 2, backend="torch").backend_choice.chosen == "torch"
    with pytest.raises(ValueError, match="runs on the CPU"):
        backends.quantizer_backend("numba", "cuda", mse_bits=2, dim=16)
    assert backends.quantizer_backend("auto", "cuda", mse_bits=5, dim=16).chosen == "torch"  # 5 bits: no kernel
    with pytest.raises(ValueError, match="bits=1 does not have"):
        tq.TurboQuantProd(16, 1, backend="numba")  # pure QJL: no MSE stage to encode
    assert tq.TurboQuantProd(16, 1, backend="auto").backend_choice.chosen == "torch"
    real_find_spec = backends.importlib.util.find_spec
    monkeypatch.setattr(backends.importlib.util, "find_spec",
                        lambda name, *a: None if name == "numba" else real_find_spec(name, *a))
    with pytest.raises(ValueError, match="numba package is not installed"):
        tq.TurboQuantMSE(16, 2, backend="numba")
    assert tq.TurboQuantMSE(16, 2, backend="auto").backend_choice.chosen == "torch"  # falls back to the torch path


@pytest.mark.parametrize("cls", [tq.TurboQuantMSE, tq.TurboQuantProd])
def test_auto_keeps_small_inputs_on_the_torch_path(cls, monkeypatch) -> None:
    """A KV cache writes one token per layer per step: numba's parallel start-up would cost more than the work."""
    from turboquant.kernels import quantize_cpu

    calls = []
    for name in ("quantize_mse_cpu", "quantize_prod_cpu"):
        original = getattr(quantize_cpu, name)
        monkeypatch.setattr(quantize_cpu, name, lambda *a, _f=original, **k: calls.append(1) or _f(*a, **k))
    q = cls(64, 3, backend="auto")
    small = torch.randn(4, 64)
    large = torch.randn(quantizers._NUMBA_MIN_COORDINATES // 64, 64)
    q.quantize(small)
    assert calls == []
    q.quantize(large)
    assert calls == [1]
    cls(64, 3, backend="numba").quantize(small)
    assert calls == [1, 1], "an explicit backend='numba' always runs the encoder"
