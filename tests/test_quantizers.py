"""TurboQuant_mse, QJL and TurboQuant_prod against the paper's theory (Theorems 1-2, Lemma 4)."""

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

import turboquant as tq


def unit_vectors(n: int, dim: int, seed: int) -> torch.Tensor:
    x = torch.randn(n, dim, generator=torch.Generator().manual_seed(seed))
    return x / x.norm(dim=-1, keepdim=True)


@pytest.mark.parametrize("dim, n", [(64, 20000), (128, 20000), (1536, 3000)])
@pytest.mark.parametrize("bits", range(1, 5))
def test_measured_mse_matches_codebook(dim, n, bits):
    q = tq.TurboQuantMSE(dim, bits, seed=bits)
    x = unit_vectors(n, dim, seed=dim + bits)
    measured = ((q.dequantize(q.quantize(x)) - x) ** 2).sum(-1).mean().item()
    assert measured == pytest.approx(q.codebook.mse, rel=0.02)
    assert tq.bounds.mse_lower_bound(bits) < measured < tq.bounds.mse_upper_bound(bits)


def test_hadamard_rotation_distortion_close_to_haar():
    x = unit_vectors(20000, 96, seed=0)  # 96 is not a power of two: the three-round transform
    q = tq.TurboQuantMSE(96, 3, rotation="hadamard")
    measured = ((q.dequantize(q.quantize(x)) - x) ** 2).sum(-1).mean().item()
    assert measured == pytest.approx(q.codebook.mse, rel=0.03)


@pytest.mark.parametrize("bits", range(1, 5))
def test_prod_is_unbiased_and_within_variance_bound(bits):
    # Unbiasedness is over the draw of the quantizer (S, and Π), for a fixed pair (x, y). The MSE stage's
    # rotation does not enter the argument (QJL is unbiased given any residual), so the fast Hadamard
    # rotation keeps 500 independent quantizers cheap.
    dim = 64
    x = unit_vectors(1, dim, seed=1)
    y = (0.6 * x + 0.8 * unit_vectors(1, dim, seed=2))  # a strongly correlated pair
    truth = (y @ x.T).item()
    estimates = []
    for seed in range(500):
        q = tq.TurboQuantProd(dim, bits, rotation="hadamard", seed=seed)
        estimates.append(q.inner_product(y, q.quantize(x)).item())
    err = torch.tensor(estimates) - truth
    standard_error = err.std().item() / math.sqrt(len(err))
    assert abs(err.mean().item()) < 3 * standard_error
    assert (err ** 2).mean().item() < tq.bounds.prod_upper_bound(bits, dim, y.norm().item())


@pytest.mark.parametrize("bits", [1, 2, 3])
def test_prod_distortion_matches_theory(bits):
    # Average over several S draws: for one fixed S the conditional D_prod fluctuates by a few percent.
    dim = 128
    x, y = unit_vectors(4000, dim, seed=3), unit_vectors(300, dim, seed=4)
    measured = sum(((q.inner_product(y, q.quantize(x)) - y @ x.T) ** 2).mean().item()
                   for q in (tq.TurboQuantProd(dim, bits, seed=s) for s in range(6))) / 6
    assert measured == pytest.approx(tq.bounds.prod_distortion(bits, dim), rel=0.05)


def test_mse_one_bit_shrinks_inner_products_by_two_over_pi():
    # For Lloyd-Max centroids E[Y c(Y)] = E[c(Y)²], so for a Haar rotation and uniform x,
    # E⟨x, x̃⟩ = d·E[c²] = 1 − D_mse, which → 2/π at b = 1: TurboQuant_mse shrinks inner products of
    # correlated pairs (the paper's motivation for TurboQuant_prod). TurboQuant_prod does not.
    dim, n = 256, 20000
    x = unit_vectors(n, dim, seed=5)
    shrink = 1 - tq.lloyd_max_codebook(dim, 1).mse
    assert abs(shrink - 2 / math.pi) < 0.005
    mse = tq.TurboQuantMSE(dim, 1)
    alignment = (mse.dequantize(mse.quantize(x)) * x).sum(-1)
    assert alignment.mean().item() == pytest.approx(shrink, abs=3 * alignment.std().item() / math.sqrt(n))
    prod = tq.TurboQuantProd(dim, 1)
    alignment = (prod.dequantize(prod.quantize(x)) * x).sum(-1)
    assert abs(alignment.mean().item() - 1) < 0.02


@pytest.mark.parametrize("quantizer", [tq.TurboQuantMSE(48, 3), tq.TurboQuantProd(48, 3), tq.QJL(48)],
                         ids=["mse", "prod", "qjl"])
def test_inner_product_equals_dequantized_dot(quantizer):
    x = torch.randn(70, 48) * 3
    y = torch.randn(5, 48)
    q = quantizer.quantize(x)
    torch.testing.assert_close(quantizer.inner_product(y, q), y @ quantizer.dequantize(q).T,
                               atol=1e-4, rtol=1e-4)


def test_prod_score_stages_describe_algorithm_2():
    """The MSE stage of b - 1 bits, then QJL on the residual, weighted by ‖r‖ at scale √(π/2)/d; the mean weight
    is √D_mse(b - 1) (Theorem 1), which the stored residual norms of unit vectors reproduce."""
    quantizer = tq.TurboQuantProd(128, 3)
    mse, qjl = quantizer.score_stages()
    assert (mse.codes, mse.bits, mse.row_weight, mse.scale) == ("codes", 2, None, 1.0)
    assert (qjl.codes, qjl.bits, qjl.row_weight) == ("qjl_signs", 1, "residual_norms")
    assert qjl.scale == pytest.approx(math.sqrt(math.pi / 2) / 128) and qjl.centroids.tolist() == [-1.0, 1.0]
    x = torch.randn(2000, 128)
    residual = quantizer.quantize(x / x.norm(dim=1, keepdim=True)).residual_norms
    assert abs(residual.mean().item() - qjl.mean_row_weight) < 0.02 * qjl.mean_row_weight


def test_qjl_variance_matches_lemma_4():
    # For unit x and y the estimate is the mean of d i.i.d. terms √(π/2)·⟨s, y⟩·sign⟨s, x⟩, so
    # Var = (π/2 − ⟨y, x⟩²)/d ≤ π/(2d) (Lemma 4). For one fixed S the mean square error over the pairs
    # fluctuates by a few percent around it: average four draws of S.
    dim = 128
    x, y = unit_vectors(2000, dim, seed=7), unit_vectors(100, dim, seed=8)
    expected = ((math.pi / 2 - (y @ x.T) ** 2) / dim).mean().item()
    assert expected < math.pi / (2 * dim)
    errors = []
    for seed in range(4):
        q = tq.QJL(dim, seed=seed)
        errors.append(q.inner_product(y, q.quantize(x)) - y @ x.T)
    err = torch.stack(errors)
    assert (err ** 2).mean().item() == pytest.approx(expected, rel=0.03)
    assert abs(err.mean().item()) < 3 * err.std().item() / math.sqrt(err.numel() / 100)


@pytest.mark.parametrize("make", [lambda: tq.TurboQuantMSE(40, 3), lambda: tq.TurboQuantProd(40, 3),
                                  lambda: tq.TurboQuantProd(40, 1), lambda: tq.QJL(40)])
def test_nbytes_counts_what_is_stored(make):
    q = make()
    stored = q.quantize(torch.randn(6, 5, 40))
    code_bytes = math.ceil(40 * q.mse_bits / 8)
    sign_bytes = math.ceil(40 / 8) if stored.qjl_signs is not None else 0
    float_count = 1 + (stored.residual_norms is not None)
    assert stored.codes.shape == (6, 5, code_bytes)
    assert stored.nbytes == 30 * (code_bytes + sign_bytes + 4 * float_count)
    assert stored.bits_per_coordinate == pytest.approx(stored.nbytes * 8 / (30 * 40))


def test_zero_vectors_are_exact_and_norms_any_size():
    q = tq.TurboQuantProd(32, 3)
    x = torch.randn(5, 32)
    x[1] = 0
    x[2] *= 1e4
    x[3] *= 1e-4
    x_hat = q.dequantize(q.quantize(x))
    assert torch.equal(x_hat[1], torch.zeros(32))
    rel = ((x_hat - x).norm(dim=-1) / x.norm(dim=-1).clamp_min(1e-30))[[0, 2, 3, 4]]
    assert rel.max() < 1.0 and rel.std() < 0.5  # the relative error does not depend on the norm


def test_slicing_and_concatenation():
    q = tq.TurboQuantProd(32, 2)
    x = torch.randn(10, 32)
    stored = q.quantize(x)
    joined = tq.QuantizedVectors.cat([stored[:4], stored[4:]])
    torch.testing.assert_close(q.dequantize(joined), q.dequantize(stored))
    assert len(stored[2:5]) == 3


@settings(max_examples=25, deadline=None)
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=3), dim=st.integers(2, 40),
       bits=st.integers(1, 5), scale=st.floats(1e-3, 1e3), kind=st.sampled_from(["mse", "prod"]),
       dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]),
       rotation=st.sampled_from(["haar", "hadamard"]))
def test_any_shape_dtype_and_norm(shape, dim, bits, scale, kind, dtype, rotation):
    cls = tq.TurboQuantMSE if kind == "mse" else tq.TurboQuantProd
    q = cls(dim, bits, rotation=rotation, seed=1)
    x = (torch.randn(*shape, dim) * scale).to(dtype)
    stored = q.quantize(x)
    assert stored.shape == tuple(shape)
    x_hat = q.dequantize(stored)
    assert x_hat.shape == x.shape and x_hat.dtype == dtype
    assert torch.isfinite(x_hat.float()).all()
    norms = x.float().norm(dim=-1)
    torch.testing.assert_close(stored.norms, norms, rtol=1e-5, atol=0)
    # The error never exceeds what a unit vector can suffer (‖x − x̃‖ ≤ ‖x‖ + ‖x̃‖), scaled by the norm.
    assert ((x_hat.float() - x.float()).norm(dim=-1) <= 3.5 * norms * math.sqrt(dim) + 1e-6).all()
    scores = q.inner_product(torch.randn(3, dim), stored)
    assert scores.shape == (3, *shape)


def test_errors():
    q = tq.TurboQuantMSE(16, 2)
    with pytest.raises(ValueError, match="dim must be an integer ≥ 2"):
        tq.TurboQuantMSE(1, 2)
    with pytest.raises(ValueError, match=r"TurboQuantMSE bits must be an integer in \[1, 8\], got 0"):
        tq.TurboQuantMSE(16, 0)
    with pytest.raises(ValueError, match=r"TurboQuantProd bits must be an integer in \[1, 8\], got 9"):
        tq.TurboQuantProd(16, 9)
    with pytest.raises(ValueError, match="rotation must be one of"):
        tq.TurboQuantProd(16, 2, rotation="dct")
    with pytest.raises(ValueError, match=r"x must have last dimension 16, got shape \(3, 15\)"):
        q.quantize(torch.randn(3, 15))
    bad = torch.randn(3, 16)
    bad[1, 2] = float("nan")
    with pytest.raises(ValueError, match="x contains NaN or Inf"):
        q.quantize(bad)
    bad[1, 2] = float("inf")
    with pytest.raises(ValueError, match="x contains NaN or Inf"):
        q.quantize(bad)
    with pytest.raises(ValueError, match="x must be float16, bfloat16, float32 or float64"):
        q.quantize(torch.ones(2, 16, dtype=torch.int32))
    with pytest.raises(ValueError, match="y must have last dimension 16"):
        q.inner_product(torch.randn(2, 8), q.quantize(torch.randn(2, 16)))
    other = tq.TurboQuantMSE(16, 2, seed=1).quantize(torch.randn(2, 16))
    with pytest.raises(ValueError, match=r"these codes were made by TurboQuantMSE\(dim=16, bits=2, rotation=haar, seed=1"):
        q.dequantize(other)
    with pytest.raises(ValueError, match="these codes were made by TurboQuantMSE"):
        tq.TurboQuantProd(16, 3).inner_product(torch.randn(1, 16), other)
    with pytest.raises(ValueError, match="different settings"):
        tq.QuantizedVectors.cat([q.quantize(torch.randn(2, 16)), other])


@pytest.mark.parametrize("cls", [tq.TurboQuantMSE, tq.TurboQuantProd])
@pytest.mark.parametrize("backend", ["torch", "numba"])
@pytest.mark.parametrize("rotation", ["haar", "hadamard"])
def test_non_finite_input_is_refused_by_every_encoder(cls, backend, rotation):
    """Finiteness is checked through the norms each encoder computes: NaN, ±Inf, and float64 vectors whose
    norm is beyond float32 (the stored norm would be Inf) all raise, on every path."""
    q = cls(24, 3, rotation=rotation, backend=backend)
    for value in (float("nan"), float("inf"), -float("inf")):
        bad = torch.randn(70, 24)
        bad[33, 5] = value
        with pytest.raises(ValueError, match="x contains NaN or Inf"):
            q.quantize(bad)
    huge = torch.randn(5, 24, dtype=torch.float64)
    huge[2, 0] = 1e39  # finite in float64, beyond float32
    with pytest.raises(ValueError, match="overflows or underflows float32"):
        q.quantize(huge)
    assert q.quantize(torch.zeros(0, 24)).codes.shape[0] == 0


@pytest.mark.parametrize("make", [
    lambda: tq.TurboQuantMSE(48, 3, seed=2, backend="torch"), lambda: tq.TurboQuantMSE(48, 3, seed=2, backend="numba"),
    lambda: tq.TurboQuantProd(48, 3, seed=2, backend="torch"), lambda: tq.TurboQuantProd(48, 3, seed=2, backend="numba"),
    lambda: tq.QJL(48, seed=2),
], ids=["mse-torch", "mse-numba", "prod-torch", "prod-numba", "qjl"])
@pytest.mark.parametrize("scale", [1e-30, 1e30])
def test_tiny_and_huge_vectors_keep_their_direction(make, scale):
    """The norm is taken after rescaling by max |x_j|, so float32 vectors whose squares under- or overflow
    get the codes of the same direction at unit scale and the norm scale·‖x‖ (the numba encoder squares in
    float32: its rows with such norms are encoded again by the torch path)."""
    q = make()
    x = torch.randn(300, 48, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    scaled, plain = q.quantize((x * scale).float()), q.quantize(x.float())
    for field in ("codes", "qjl_signs"):
        if getattr(plain, field) is not None:
            assert torch.equal(getattr(scaled, field), getattr(plain, field))
    torch.testing.assert_close(scaled.norms.double() / scale, plain.norms.double(), rtol=1e-6, atol=0)
    assert torch.isfinite(q.dequantize(scaled)).all()


def test_stored_fields_rebuild_what_quantize_made():
    """``stored`` wraps fields a code store kept apart (fp16 norms, as the KV cache keeps them): they decode as
    the quantizer's own codes do, and a field the quantizer does not store, or one it needs, is named."""
    x = torch.randn(5, 3, 32, generator=torch.Generator().manual_seed(0))
    for quantizer in (tq.TurboQuantMSE(32, 3, seed=1), tq.TurboQuantProd(32, 3, seed=1), tq.QJL(32, seed=1)):
        qv = quantizer.quantize(x)
        kept = quantizer.stored(qv.codes, qv.norms.half(), qv.qjl_signs,
                                None if qv.residual_norms is None else qv.residual_norms.half())
        assert kept.signature == qv.signature and kept.norms.dtype == torch.float16
        widened = quantizer.stored(qv.codes, qv.norms.half().float(), qv.qjl_signs,
                                   None if qv.residual_norms is None else qv.residual_norms.half().float())
        assert torch.equal(quantizer.dequantize(kept), quantizer.dequantize(widened))
    mse, prod = tq.TurboQuantMSE(32, 3), tq.TurboQuantProd(32, 3)
    with pytest.raises(ValueError, match="stores codes, norms and nothing more, got \\['qjl_signs'\\]"):
        mse.stored(qv.codes, qv.norms, qjl_signs=qv.qjl_signs)
    with pytest.raises(ValueError, match="stores codes, norms and \\['qjl_signs', 'residual_norms'\\]"):
        prod.stored(qv.codes, qv.norms)
