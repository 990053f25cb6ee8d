"""Lloyd-Max codebooks on the exact coordinate density (paper Lemma 1, Eq. 4)."""

import numpy as np
import pytest
from scipy import integrate, stats

import turboquant as tq
from turboquant import codebook as codebook_module

# Gaussian-limit D_mse (paper.md, "Numerically"), b = 1..5.
GAUSSIAN_MSE = [0.3634, 0.1175, 0.0345, 0.0095, 0.0025]
# Exact-density values at small d (paper.md).
EXACT_MSE = {64: [0.3584, 0.1145, 0.0334, 0.0091], 128: [0.3609, 0.1160, 0.0340, 0.0093],
             1536: [0.3632, 0.1174, 0.0345, 0.0095]}


@pytest.mark.parametrize("bits", range(1, 6))
def test_gaussian_limit_matches_reference(bits):
    assert tq.lloyd_max_codebook(128, bits, "gaussian").mse == pytest.approx(GAUSSIAN_MSE[bits - 1], rel=2e-3)


@pytest.mark.parametrize("dim", sorted(EXACT_MSE))
@pytest.mark.parametrize("bits", range(1, 5))
def test_exact_density_values_sit_below_gaussian_limit(dim, bits):
    exact = tq.lloyd_max_codebook(dim, bits).mse
    assert exact == pytest.approx(EXACT_MSE[dim][bits - 1], rel=6e-3)
    assert exact < tq.lloyd_max_codebook(dim, bits, "gaussian").mse


def test_d3_is_the_uniform_quantizer():
    # At d = 3 the coordinate density is uniform on [-1, 1] (Archimedes): the optimal b-bit quantizer
    # is uniform with per-coordinate error (2/2^b)²/12, so D_mse = 3 · that = 4^-b exactly.
    for bits in range(1, 9):
        cb = tq.lloyd_max_codebook(3, bits)
        assert cb.mse == pytest.approx(4.0 ** -bits, rel=1e-9)
        step = 2 / 2 ** bits
        np.testing.assert_allclose(cb.centroids, -1 + step / 2 + step * np.arange(2 ** bits), atol=1e-9)


@pytest.mark.parametrize("dim", [2, 3, 7, 64, 1536, 16384])
@pytest.mark.parametrize("bits", [1, 2, 4, 8])
@pytest.mark.parametrize("density", ["exact", "gaussian"])
def test_fixed_point_structure(dim, bits, density):
    cb = tq.lloyd_max_codebook(dim, bits, density)
    assert cb.centroids.shape == (2 ** bits,) and cb.boundaries.shape == (2 ** bits - 1,)
    assert np.all(np.diff(cb.centroids) > 0)
    np.testing.assert_allclose(cb.centroids, -cb.centroids[::-1], atol=1e-15)
    np.testing.assert_allclose(cb.boundaries, (cb.centroids[1:] + cb.centroids[:-1]) / 2)
    # Each centroid is the conditional mean of its cell (Lloyd-Max optimality), to high precision.
    moments = codebook_module._IntervalMoments(dim, density)
    p, m1, _ = moments.cells(cb.boundaries)
    np.testing.assert_allclose(m1 / p, cb.centroids, atol=1e-8 / np.sqrt(dim))
    assert 0 < cb.mse < tq.bounds.mse_upper_bound(bits)


def test_mse_agrees_with_direct_quadrature():
    """Check the closed-form moments against numerical integration of f_d itself."""
    dim, bits = 40, 2
    cb = tq.lloyd_max_codebook(dim, bits)
    a = (dim - 1) / 2

    def density(x):
        return 0.5 * stats.beta.pdf((1 + x) / 2, a, a)

    edges = np.concatenate(([-1.0], cb.boundaries, [1.0]))
    err = sum(integrate.quad(lambda x, c=c: (x - c) ** 2 * density(x), lo, hi, epsabs=1e-14)[0]
              for c, lo, hi in zip(cb.centroids, edges[:-1], edges[1:]))
    assert dim * err == pytest.approx(cb.mse, rel=1e-8)


def test_large_dimension_approaches_gaussian():
    exact = tq.lloyd_max_codebook(16384, 3)
    gauss = tq.lloyd_max_codebook(16384, 3, "gaussian")
    np.testing.assert_allclose(exact.centroids, gauss.centroids, rtol=1e-3)


def test_cached_in_memory_and_on_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("TURBOQUANT_CACHE_DIR", str(tmp_path))
    codebook_module._cached_codebook.cache_clear()
    first = tq.lloyd_max_codebook(100, 3)
    assert tq.lloyd_max_codebook(100, 3) is first
    files = list((tmp_path / "codebooks").glob("exact_d100_b3_*.npz"))
    assert len(files) == 1
    codebook_module._cached_codebook.cache_clear()
    calls = []
    monkeypatch.setattr(codebook_module, "_solve_lloyd_max", lambda *a: calls.append(a))
    again = tq.lloyd_max_codebook(100, 3)
    assert not calls, "a disk-cached codebook was solved again"
    np.testing.assert_array_equal(again.centroids, first.centroids)
    codebook_module._cached_codebook.cache_clear()


@pytest.mark.parametrize("kwargs, message", [
    (dict(dim=1, bits=2), "dim must be an integer ≥ 2"),
    (dict(dim=64, bits=0), r"bits must be an integer in \[1, 8\]"),
    (dict(dim=64, bits=9), r"bits must be an integer in \[1, 8\]"),
    (dict(dim=64, bits=2.0), r"bits must be an integer"),
    (dict(dim=64, bits=2, density="laplace"), "density must be one of"),
])
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        tq.lloyd_max_codebook(**kwargs)


def test_symmetric_codebook_reads_a_table_once_and_again_after_a_change(monkeypatch):
    import torch

    table = tq.lloyd_max_codebook(64, 3).centroids_tensor().clone()
    reads = []
    original = torch.Tensor.to
    monkeypatch.setattr(torch.Tensor, "to", lambda self, *a, **k: reads.append(1) or original(self, *a, **k))
    assert codebook_module.symmetric_codebook(table) and codebook_module.symmetric_codebook(table)
    assert len(reads) == 1  # the second answer is the kept one
    table[0] += 0.5  # an in-place change bumps the tensor's version: asked again, and now not symmetric
    assert not codebook_module.symmetric_codebook(table) and len(reads) == 2
    assert not codebook_module.symmetric_codebook(torch.tensor([-1.0, 0.5, 1.0]))


def test_symmetric_codebook_answers_for_inference_tensors():
    import torch

    with torch.inference_mode():  # how generation runs: its tensors have no version counter
        table = tq.lloyd_max_codebook(64, 3).centroids_tensor().clone()
        skewed = torch.tensor([-1.0, 0.5, 1.0])
    assert table.is_inference()
    assert codebook_module.symmetric_codebook(table) and codebook_module.symmetric_codebook(table)
    assert not codebook_module.symmetric_codebook(skewed)
