"""The faiss baselines behind the shared interface: exact recall 1, recall trends, storage, persistence."""

import warnings

import numpy as np
import pytest

pytest.importorskip("faiss")

from turboquant.ann import TrainingSizeWarning, load_index, make_index, recall_at_1_at_k  # noqa: E402


def _top1(base, queries):
    return np.argmax(queries @ base.T, axis=1)


def test_exact_search_has_recall_one(clustered_data):
    base, queries = clustered_data
    index = make_index("exact", base.shape[1])
    index.add(base)
    scores, ids = index.search(queries, 4)
    assert recall_at_1_at_k(_top1(base, queries), ids, [1, 4]) == {1: 1.0, 4: 1.0}
    np.testing.assert_allclose(scores[:, 0], np.max(queries @ base.T, axis=1), rtol=1e-5)


@pytest.mark.parametrize("method", ["pq", "pq_fastscan", "rabitq"])
def test_baseline_recall_rises_with_bits_and_k(small_clustered_data, method):
    base, queries = small_clustered_data
    truth = _top1(base, queries)
    recalls = {}
    for bits in (2, 4):
        index = make_index(method, base.shape[1], bits)
        with pytest.raises(ValueError, match="trained"):
            index.add(base)
        index.train(base)
        index.add(base)
        recalls[bits] = recall_at_1_at_k(truth, index.search(queries, 16)[1], [1, 4, 16])
        assert recalls[bits][1] <= recalls[bits][4] <= recalls[bits][16]
    assert recalls[2][1] < recalls[4][1]


def test_pq_is_lut256_with_padding():
    pq = make_index("pq", 50, 2)  # 4 coordinates per 8-bit code: 50 -> 52 padded coordinates, 13 codes
    assert pq.sub_vector_length == 4 and pq.padded_dim == 52 and pq.faiss_index.pq.M == 13
    assert pq.faiss_index.pq.nbits == 8
    assert make_index("pq", 1536, 4).faiss_index.pq.M == 768  # d/2 sub-quantizers at 4 bits
    assert make_index("pq_fastscan", 1536, 4).faiss_index.pq.M == 1536  # 16 codewords per coordinate
    with pytest.raises(ValueError, match="dividing 8"):
        make_index("pq", 64, 3)


def test_pq_training_short_of_faiss_kmeans_minimum_warns_once(capfd):
    """faiss's k-means asks for 39 points per codeword and prints a line per sub-quantizer below that (d / 2 lines
    at 4 bits); the index says it once, as a TrainingSizeWarning, and faiss says nothing."""
    rows = np.random.default_rng(0).standard_normal((39 * 256, 64)).astype(np.float32)
    assert make_index("pq", 64, 4).recommended_training_rows == 39 * 256
    assert make_index("pq_fastscan", 64, 4).recommended_training_rows == 39 * 16
    assert {make_index(m, 64, 4).recommended_training_rows for m in ("rabitq", "turboquant_mse")} == {1}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make_index("pq", 64, 4).train(rows)
    with pytest.warns(TrainingSizeWarning, match="pq: training on 9983 rows, fewer than the 9984") as caught:
        make_index("pq", 64, 4).train(rows[:-1])
    assert len(caught) == 1 and "WARNING clustering" not in capfd.readouterr().err


def test_rabitq_uses_extended_bits_and_float_queries():
    index = make_index("rabitq", 64, 4)
    assert index.faiss_index.rabitq.nb_bits == 4 and index.faiss_index.qb == 0
    with pytest.raises(ValueError, match="1..9"):
        make_index("rabitq", 64, 10)


@pytest.mark.parametrize("method", ["exact", "pq", "pq_fastscan", "rabitq"])
def test_save_load_round_trip(tmp_path, small_clustered_data, method):
    base, queries = small_clustered_data
    index = make_index(method, base.shape[1], None if method == "exact" else 2)
    index.train(base)
    index.add(base)
    loaded = load_index(index.save(tmp_path / method))
    assert type(loaded) is type(index) and loaded.config() == index.config()
    np.testing.assert_array_equal(loaded.search(queries, 5)[1], index.search(queries, 5)[1])


def test_load_rejects_foreign_files(tmp_path):
    np.savez(tmp_path / "other.npz", x=np.zeros(3))
    with pytest.raises(ValueError, match="not a saved index"):
        load_index(tmp_path / "other.npz")
    with pytest.raises(ValueError, match="no saved index"):
        load_index(tmp_path / "missing.npz")
