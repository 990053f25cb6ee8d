"""The paper's bounds (Theorems 1-3) and the exact D_prod of TurboQuant_prod."""

import math

import pytest

import turboquant as tq
from turboquant import bounds


def test_constants():
    assert bounds.mse_upper_bound(0) == pytest.approx(math.sqrt(3) * math.pi / 2)  # not sqrt(3*pi)/2
    assert bounds.mse_upper_bound(1) == pytest.approx(0.6802, abs=1e-4)
    assert bounds.prod_upper_bound(2, 100, y_norm=2.0) == pytest.approx(math.sqrt(3) * math.pi ** 2 * 4 / 100 / 16)
    assert bounds.prod_lower_bound(3, 50) == pytest.approx(1 / 50 / 64)


@pytest.mark.parametrize("bits", range(1, 9))
def test_codebooks_sit_between_the_bounds(bits):
    for dim in (64, 1536):
        mse = tq.lloyd_max_codebook(dim, bits).mse
        assert bounds.mse_lower_bound(bits) < mse < bounds.mse_upper_bound(bits)
        prod = bounds.prod_distortion(bits, dim)
        assert bounds.prod_lower_bound(bits, dim) < prod < bounds.prod_upper_bound(bits, dim)


def test_prod_distortion_matches_paper_values():
    # paper.md: d·D_prod = 1.5708, 0.5708, 0.1845, 0.0543 (Gaussian limit).
    for bits, expected in zip(range(1, 5), [1.5708, 0.5708, 0.1845, 0.0543]):
        assert 16384 * bounds.prod_distortion(bits, 16384) == pytest.approx(expected, rel=2e-3)


@pytest.mark.parametrize("call", [
    lambda: bounds.mse_upper_bound(-1), lambda: bounds.prod_upper_bound(2, 1),
    lambda: bounds.prod_distortion(0, 64), lambda: bounds.prod_lower_bound(1.5, 64),
])
def test_bad_arguments(call):
    with pytest.raises(ValueError):
        call()
