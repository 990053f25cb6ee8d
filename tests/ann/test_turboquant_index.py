"""TurboQuantIndex: agreement with the library's quantizers, scorers, recall trends, persistence, errors."""

import numpy as np
import pytest
import torch

from turboquant.ann import TurboQuantIndex, load_index, make_index, recall_at_1_at_k


def _exact_top1(base, queries):
    return np.argmax(queries @ base.T, axis=1)


@pytest.mark.parametrize(("variant", "bits"), [("mse", 2), ("mse", 3), ("mse", 4), ("prod", 2), ("prod", 4)])
def test_scores_equal_the_quantizers_inner_product(clustered_data, variant, bits):
    base, queries = clustered_data
    index = TurboQuantIndex(base.shape[1], bits, variant=variant, chunk_size=1500)
    index.add(base[:2000])
    index.add(base[2000:])  # two adds: ids continue, chunks straddle the add boundary
    reference = index.quantizer.inner_product(torch.from_numpy(queries), index.quantizer.quantize(torch.from_numpy(base)))
    np.testing.assert_allclose(index.scores(queries), reference.numpy(), rtol=0, atol=1e-5)


@pytest.mark.parametrize(("variant", "bits"), [("mse", 1), ("mse", 2), ("mse", 4), ("prod", 2), ("prod", 3)])
def test_lut_scoring_equals_dense_scoring(clustered_data, variant, bits):
    base, queries = clustered_data
    dense = TurboQuantIndex(base.shape[1], bits, variant=variant, scorer="dense")
    lut = TurboQuantIndex(base.shape[1], bits, variant=variant, scorer="lut")
    dense.add(base)
    lut.add(base)
    np.testing.assert_allclose(lut.scores(queries[:20]), dense.scores(queries[:20]), rtol=0, atol=2e-5)


def test_odd_dimension_pads_codes_without_changing_scores():
    rng = np.random.default_rng(1)
    base = rng.standard_normal((300, 50)).astype(np.float32)  # 50 coords: last 2-bit byte half used
    queries = rng.standard_normal((5, 50)).astype(np.float32)
    dense, lut = TurboQuantIndex(50, 2), TurboQuantIndex(50, 2, scorer="lut")
    dense.add(base)
    lut.add(base)
    reference = dense.quantizer.inner_product(torch.from_numpy(queries), dense.quantizer.quantize(torch.from_numpy(base)))
    np.testing.assert_allclose(dense.scores(queries), reference.numpy(), atol=1e-5)
    np.testing.assert_allclose(lut.scores(queries), reference.numpy(), atol=1e-5)


def test_search_returns_the_top_k_of_the_scores(clustered_data):
    base, queries = clustered_data
    index = TurboQuantIndex(base.shape[1], 3, chunk_size=700)
    index.add(base)
    scores, ids = index.search(queries, 16)
    all_scores = index.scores(queries)
    np.testing.assert_allclose(scores, -np.sort(-all_scores, axis=1)[:, :16], atol=1e-6)
    np.testing.assert_allclose(np.take_along_axis(all_scores, ids, axis=1), scores, atol=1e-6)
    assert ids.dtype == np.int64 and scores.dtype == np.float32


def test_recall_rises_with_bits_and_with_k(clustered_data):
    base, queries = clustered_data
    truth = _exact_top1(base, queries)
    recalls = {}
    for bits in (1, 2, 4):
        index = TurboQuantIndex(base.shape[1], bits)
        index.add(base)
        recalls[bits] = recall_at_1_at_k(truth, index.search(queries, 32)[1], [1, 4, 32])
    for bits in (1, 2, 4):
        assert recalls[bits][1] <= recalls[bits][4] <= recalls[bits][32]
    assert recalls[1][1] < recalls[2][1] < recalls[4][1]
    assert recalls[4][1] > 0.5 and recalls[4][32] > 0.95


def test_save_load_round_trip(tmp_path, clustered_data):
    base, queries = clustered_data
    for variant in ("mse", "prod"):
        index = TurboQuantIndex(base.shape[1], 3, variant=variant, seed=5, rotation="hadamard")
        index.add(base)
        path = index.save(tmp_path / f"{variant}.npz")
        loaded = load_index(path)
        assert isinstance(loaded, TurboQuantIndex) and loaded.config() == index.config()
        assert loaded.ntotal == index.ntotal and loaded.nbytes == index.nbytes
        before, after = index.search(queries, 10), loaded.search(queries, 10)
        np.testing.assert_array_equal(before[1], after[1])
        np.testing.assert_array_equal(before[0], after[0])


def test_storage_is_codes_plus_norms():
    index = TurboQuantIndex(256, 4)
    index.add(np.random.default_rng(0).standard_normal((10, 256)).astype(np.float32))
    assert index.nbytes == 10 * (256 * 4 // 8 + 4) and index.bits_per_coordinate == 4 + 32 / 256
    prod = TurboQuantIndex(100, 2, variant="prod")
    prod.add(np.ones((3, 100), np.float32))
    assert prod.nbytes == 3 * (13 + 4 + 13 + 4)  # 1-bit MSE codes, norm, 1-bit signs, residual norm


@pytest.mark.parametrize(
    ("action", "message"),
    [
        (lambda i: i.add(np.ones((3, 7), np.float32)), "dimension 7"),
        (lambda i: i.add(np.ones(8, np.float32)), "2-D"),
        (lambda i: i.add(np.full((2, 8), np.nan, np.float32)), "NaN"),
        (lambda i: i.search(np.ones((1, 8), np.float32), 3), "exceeds"),
        (lambda i: i.search(np.ones((1, 8), np.float32), 0), "at least 1"),
        (lambda i: i.search(np.ones((1, 9), np.float32), 1), "dimension 9"),
        (lambda i: i.search(np.array([[np.inf] * 8], np.float32), 1), "NaN or infinite"),
    ],
)
def test_clear_errors(action, message):
    index = TurboQuantIndex(8, 2)
    index.add(np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32))
    with pytest.raises(ValueError, match=message):
        action(index)


def test_constructor_errors():
    with pytest.raises(ValueError, match="variant"):
        TurboQuantIndex(8, 2, variant="fast")
    with pytest.raises(ValueError, match="bits >= 2"):
        TurboQuantIndex(8, 1, variant="prod")
    with pytest.raises(ValueError, match="dividing 8"):
        TurboQuantIndex(8, 3, scorer="lut")
    with pytest.raises(ValueError, match="unknown index method"):
        make_index("lsh", 8, 2)
    with pytest.raises(ValueError, match="empty"):
        TurboQuantIndex(8, 2).search(np.ones((1, 8), np.float32), 1)


def test_encoder_backends_give_the_reference_codes(clustered_data):
    """backend='auto' adds through the fused numba encoder on the CPU; its codes are the torch path's
    (bit for bit with Haar), so the searches agree; the backend survives save/load."""
    pytest.importorskip("numba")
    base, queries = clustered_data
    fast = TurboQuantIndex(base.shape[1], 4, rotation="haar", backend="auto")
    slow = TurboQuantIndex(base.shape[1], 4, rotation="haar", backend="torch")
    assert (fast.encoder, slow.encoder) == ("numba", "torch")
    assert TurboQuantIndex(base.shape[1], 4, variant="prod").encoder == "numba"
    fast.add(base)
    slow.add(base)
    for key, array in fast.state_arrays().items():
        np.testing.assert_array_equal(array, slow.state_arrays()[key])
    np.testing.assert_array_equal(fast.search(queries, 5)[1], slow.search(queries, 5)[1])
    assert fast.config()["backend"] == "auto"
