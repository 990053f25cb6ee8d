"""The fast-scan search path: faiss's 4-bit fast-scan engine proposes candidates, the exact estimator re-ranks."""

import numpy as np
import pytest
import torch

pytest.importorskip("faiss")

from turboquant.ann import TurboQuantIndex, fastscan, load_index, recall_at_1_at_k  # noqa: E402
from turboquant.ann.fastscan import FastScanLayout, FastScanStage  # noqa: E402

FASTSCAN_CASES = [("mse", 1), ("mse", 2), ("mse", 4), ("prod", 2), ("prod", 4)]


def _pair(dim, bits, variant="mse", **options):
    fast = TurboQuantIndex(dim, bits, variant=variant, scorer="fastscan", **options)
    dense = TurboQuantIndex(dim, bits, variant=variant, scorer="dense", **options)
    return fast, dense


@pytest.mark.parametrize(("variant", "bits"), FASTSCAN_CASES)
def test_fastscan_answers_are_the_dense_scorers(clustered_data, variant, bits, monkeypatch):
    """Same ids and (to float32 rounding) the same scores as the dense scorer, for database rows of any norm
    and over several adds (rows dealt to both shards, chunks straddling the add boundary)."""
    monkeypatch.setattr(fastscan, "_PARALLEL_MIN_BYTES", 0)  # a single query's shards scanned in two threads
    base, queries = clustered_data
    scaled = base * np.random.default_rng(3).uniform(0.5, 2.0, (len(base), 1)).astype(np.float32)
    fast, dense = _pair(base.shape[1], bits, variant, chunk_size=1500)
    assert fast.search_path == "fastscan" and dense.search_path == "dense"
    fast._fastscan = fastscan.FastScanCodes(fast._fastscan.layout, shards=2)  # two shards on any machine
    fast.add(scaled[:2001])
    fast.add(scaled[2001:])
    dense.add(scaled)
    assert len(fast._fastscan._shards) == 2
    for batch in (queries, queries[:1]):  # a batch (faiss threads over queries) and one query (threads over shards)
        (d_fast, i_fast), (d_dense, i_dense) = fast.search(batch, 10), dense.search(batch, 10)
        np.testing.assert_array_equal(i_fast, i_dense)
        np.testing.assert_allclose(d_fast, d_dense, rtol=0, atol=2e-5)


@pytest.mark.parametrize(("variant", "bits"), [("mse", 2), ("mse", 4), ("prod", 4)])
def test_fastscan_recall_equals_the_dense_scorers(clustered_data, variant, bits):
    base, queries = clustered_data
    truth = np.argmax(queries @ base.T, axis=1)
    fast, dense = _pair(base.shape[1], bits, variant)
    fast.add(base)
    dense.add(base)
    ks = [1, 10, 100]
    assert recall_at_1_at_k(truth, fast.search(queries, 100)[1], ks) == recall_at_1_at_k(
        truth, dense.search(queries, 100)[1], ks)


@pytest.mark.parametrize(("variant", "bits"), FASTSCAN_CASES)
def test_candidate_scores_approximate_the_unit_norm_scores(clustered_data, variant, bits):
    """faiss's candidate score is the unit-norm estimate (mean QJL weight for prod) up to its 8-bit tables."""
    base, queries = clustered_data
    index = TurboQuantIndex(base.shape[1], bits, variant=variant, scorer="fastscan")
    index.add(base)
    transformed = index._transform(torch.from_numpy(queries))
    scores, ids = index._fastscan.search(transformed, 20)
    unit = index._candidate_scores(transformed, ids)
    if variant == "prod":  # the candidate score replaces each row's residual norm by its expectation
        assert np.corrcoef(scores.ravel(), unit.ravel())[0, 1] > 0.95
    else:
        np.testing.assert_allclose(scores, unit, rtol=0, atol=0.02 * np.abs(unit).max())


def test_layout_reuses_the_packed_stream_and_pairs_coordinates():
    centroids = np.array([-1.5, -0.5, 0.5, 1.5])
    layout = FastScanLayout([FastScanStage(centroids, 2, 1.0)], dim=50)
    assert (layout.group, layout.n_sub, layout.code_size) == (2, 25, 13)  # 2 coordinates per 4-bit code, + guard
    # nibble v = code(2m) | code(2m+1) << 2: centroid pair (c[v & 3], c[v >> 2])
    np.testing.assert_array_equal(layout.centroids[0b0111], [1.5, -0.5])
    packed = np.arange(26, dtype=np.uint8).reshape(2, 13)
    assert layout.codes([packed]) is not None and np.array_equal(layout.codes([packed]), packed)
    queries, guard = layout.queries([np.arange(50, dtype=np.float32)[None]])
    assert queries.shape == (1, 52) and queries[0, 49] == 49  # 25 pairs, then the guard's pair
    assert guard[0] == 0 and not queries[0, 50:].any()  # 25 sub-quantizers cannot overflow: no guard needed
    prod = FastScanLayout([FastScanStage(np.arange(8.0), 3, 1.0), FastScanStage(np.array([-1.0, 1.0]), 1, 0.25)], 4)
    assert (prod.group, prod.sub_dim) == (1, 2)
    np.testing.assert_array_equal(prod.centroids[0b1101], [5.0, 0.25])  # MSE code 5, sign bit 1
    with pytest.raises(ValueError, match="dividing 4"):
        FastScanLayout([FastScanStage(np.arange(8.0), 3, 1.0)], 4)


def test_scorer_choice_and_errors():
    assert TurboQuantIndex(32, 4).search_path == "dense"  # the default (see the module docstring)
    assert TurboQuantIndex(32, 4, scorer="auto").search_path == "fastscan"  # where the layout exists
    assert TurboQuantIndex(32, 3, scorer="auto").search_path == "dense"
    assert TurboQuantIndex(32, 3, variant="prod", scorer="auto").search_path == "dense"
    with pytest.raises(ValueError, match="fastscan"):
        TurboQuantIndex(32, 3, scorer="fastscan")
    with pytest.raises(ValueError, match="rerank_factor"):
        TurboQuantIndex(32, 4, rerank_factor=0)


def test_fastscan_layout_survives_save_load_and_removal(tmp_path, clustered_data):
    base, queries = clustered_data
    index = TurboQuantIndex(base.shape[1], 4, rotation="hadamard", seed=3, scorer="fastscan")
    index.add(base)
    loaded = load_index(index.save(tmp_path / "fast.npz"))
    assert loaded.search_path == "fastscan" and loaded._fastscan.ntotal == index.ntotal
    np.testing.assert_array_equal(loaded.search(queries, 10)[1], index.search(queries, 10)[1])
    dense = TurboQuantIndex(**{**index.config(), "scorer": "dense"})
    dense.load_state_arrays(index.state_arrays())
    for target in (index, dense):
        assert target.remove_ids(np.arange(0, 4000, 3)) == 1334
    assert index._fastscan.ntotal == index.ntotal == 2666
    np.testing.assert_array_equal(index.search(queries, 10)[1], dense.search(queries, 10)[1])


def test_auto_goes_dense_when_reranking_would_cost_more(small_clustered_data):
    """scorer='auto' re-ranks for few queries or small k; many queries with a large k on a small database go
    through the dense scorer (same answers either way)."""
    base, queries = small_clustered_data
    index = TurboQuantIndex(base.shape[1], 4, scorer="auto")
    index.add(base)
    assert index._fastscan_pays(1, 10) and not index._fastscan_pays(200, 300)
    forced = TurboQuantIndex(**{**index.config(), "scorer": "fastscan"})
    forced.load_state_arrays(index.state_arrays())
    np.testing.assert_array_equal(index.search(queries, 300)[1], forced.search(queries, 300)[1])


@pytest.mark.parametrize(("variant", "bits"), [("mse", 4), ("prod", 4)])
def test_a_row_far_above_the_rest_is_found_at_large_dim(variant, bits):
    """faiss sums M 8-bit table entries in 16 bits: at d = 1536 the row holding the best code of every
    sub-quantizer has an 8-bit sum far above 2¹⁶ and, without the guard sub-quantizer, wraps to a low score."""
    dim = 1536
    index = TurboQuantIndex(dim, bits, variant=variant, rotation="hadamard", scorer="fastscan")
    rng = np.random.default_rng(0)
    index.add(rng.standard_normal((300, dim)).astype(np.float32))
    layout = index._fastscan.layout
    query = rng.standard_normal((1, dim)).astype(np.float32)
    transformed = index._transform(torch.from_numpy(query))
    faiss_query, _ = layout.queries(transformed)
    tables = faiss_query.reshape(layout.faiss_sub, layout.sub_dim) @ layout.centroids.T  # (M, 16) float tables
    best = tables[: layout.n_sub].argmax(axis=1)  # the nibble of the highest entry of each sub-quantizer
    # faiss's 8-bit rounding (round_uint8_per_column): the best row's integer sum must fit in 16 bits
    scale = 255 / np.ptp(tables, axis=1).max()
    rounded = np.floor((tables - tables.min(axis=1, keepdims=True)) * scale + 0.5)
    assert rounded[np.arange(layout.n_sub), best].sum() <= 65535 < 255 * layout.n_sub
    codes = np.zeros((1, layout.code_size), np.uint8)
    nibbles = np.append(best, layout._guard_code)
    nibbles = np.append(nibbles, 0) if len(nibbles) % 2 else nibbles
    codes[0] = nibbles[0::2] | (nibbles[1::2] << 4)
    shard = index._fastscan._shards[0]
    shard.merge_from(layout.index(codes))  # row 300 in shard 0 (one shard here, or the row's id is checked below)
    scores, ids = index._fastscan.search(transformed, 5)
    position = (shard.ntotal - 1) * len(index._fastscan._shards)
    assert ids[0, 0] == position
    np.testing.assert_allclose(scores[0, 0], (tables[: layout.n_sub].max(axis=1)).sum(), rtol=0.02)


@pytest.mark.parametrize(("bits", "dim"), [(4, 51), (4, 50), (2, 50), (2, 52)])
def test_the_guard_code_follows_the_codes_as_nibble_n_sub(bits, dim):
    """The guard's nibble (the code of its smallest entry: 15 for a descending codebook) is the high half of the
    last code byte when n_sub is odd and a byte of its own when even; the codes' nibbles are unchanged."""
    centroids = -np.sort(np.random.default_rng(0).standard_normal(2**bits))  # descending: the guard's minimum is v = 15
    layout = FastScanLayout([FastScanStage(centroids, bits, 1.0)], dim)
    assert layout._guard_code == 15 and layout.n_sub == -(-dim * bits // 4)
    packed = np.random.default_rng(1).integers(0, 256, (5, -(-dim * bits // 8)), dtype=np.uint8)
    if layout.n_sub % 2:
        packed[:, -1] &= 15  # pack_codes leaves the half byte after an odd number of nibbles zero
    codes = layout.codes([packed])
    nibbles = np.stack([codes & 15, codes >> 4], axis=2).reshape(5, -1)
    assert codes.shape[1] == layout.code_size == layout.n_sub // 2 + 1
    assert (nibbles[:, layout.n_sub] == 15).all() and not nibbles[:, layout.n_sub + 1 :].any()
    packed_nibbles = np.stack([packed & 15, packed >> 4], axis=2).reshape(5, -1)
    np.testing.assert_array_equal(nibbles[:, : layout.n_sub], packed_nibbles[:, : layout.n_sub])


@pytest.mark.parametrize(("variant", "bits"), FASTSCAN_CASES)
@pytest.mark.parametrize("dim", [51, 50])
def test_fastscan_answers_at_odd_and_even_sub_quantizer_counts(variant, bits, dim):
    """The fast path returns the dense scorer's ids whether the guard shares the last code byte or not."""
    rng = np.random.default_rng(dim)
    base = rng.standard_normal((700, dim)).astype(np.float32)
    queries = rng.standard_normal((20, dim)).astype(np.float32)
    fast, dense = _pair(dim, bits, variant)
    fast.add(base)
    dense.add(base)
    np.testing.assert_array_equal(fast.search(queries, 10)[1], dense.search(queries, 10)[1])
