"""Every index speaks faiss: ``D, I = index.search(x, k)``, array types in = out, ids, removal, reconstruction."""

import numpy as np
import pytest
import torch

from turboquant.ann import TurboQuantIndex, make_index

METHODS = [("turboquant_mse", 4), ("turboquant_prod", 3), ("pq", 4), ("pq_fastscan", 4), ("rabitq", 4), ("exact", None)]


def _new(method, bits, dim):
    if not method.startswith("turboquant"):
        pytest.importorskip("faiss")
    return make_index(method, dim, bits)


def _filled(method, bits, base):
    index = _new(method, bits, base.shape[1])
    index.train(base)
    index.add(base)
    return index


@pytest.mark.parametrize(("method", "bits"), METHODS)
def test_search_returns_a_plain_tuple_of_the_input_array_type(small_clustered_data, method, bits):
    base, queries = small_clustered_data
    index = _filled(method, bits, base)
    assert index.d == base.shape[1] and index.ntotal == len(base)
    result = index.search(queries, 5)
    assert type(result) is tuple and len(result) == 2
    D, I = result
    assert isinstance(D, np.ndarray) and D.dtype == np.float32 and I.dtype == np.int64 and I.shape == (200, 5)
    assert np.all(np.diff(D, axis=1) <= 1e-6)  # best first
    assert index.search(queries, 5)[1].shape == (200, 5)  # subscriptable, as faiss users write it
    D_t, I_t = index.search(torch.from_numpy(queries), 5)
    assert isinstance(D_t, torch.Tensor) and D_t.dtype == torch.float32 and I_t.dtype == torch.int64
    np.testing.assert_array_equal(I_t.numpy(), I)


@pytest.mark.parametrize(("method", "bits"), METHODS)
def test_ids_removal_reconstruction_reset(small_clustered_data, method, bits):
    base, queries = small_clustered_data
    index = _new(method, bits, base.shape[1])
    index.train(base)
    labels = 10_000 + 7 * np.arange(len(base))
    index.add_with_ids(base, labels)
    _, I = index.search(base[:20], 1)
    reference = _filled(method, bits, base)
    np.testing.assert_array_equal(I, labels[reference.search(base[:20], 1)[1]])  # labels, not positions
    np.testing.assert_allclose(index.reconstruct(int(labels[3])), reference.reconstruct(3), atol=1e-6)
    assert np.linalg.norm(index.reconstruct(int(labels[3])) - base[3]) < 1.0
    assert index.remove_ids(labels[:100]) == 100 and index.ntotal == len(base) - 100
    assert index.remove_ids(labels[:100]) == 0
    assert not np.isin(index.search(queries, 10)[1], labels[:100]).any()
    with pytest.raises(KeyError):
        index.reconstruct(int(labels[0]))
    with pytest.raises(ValueError, match="distinct"):
        index.add_with_ids(base[:2], labels[100:102])
    with pytest.raises(ValueError, match="shape"):
        index.add_with_ids(base[:2], labels[:3])
    index.reset()
    assert index.ntotal == 0
    index.add(base[:10])
    np.testing.assert_array_equal(index.search(base[:3], 1)[1][:, 0], [0, 1, 2])


@pytest.mark.parametrize(("method", "bits"), [("turboquant_mse", 4), ("exact", None)])
def test_range_search_returns_every_row_above_the_radius(small_clustered_data, method, bits):
    base, queries = small_clustered_data
    index = _filled(method, bits, base)
    lims, D, I = index.range_search(queries[:5], 0.8)
    scores = index.scores(queries[:5]) if isinstance(index, TurboQuantIndex) else queries[:5] @ base.T
    for i in range(5):
        expected = np.flatnonzero(scores[i] > 0.8)
        assert sorted(I[lims[i] : lims[i + 1]]) == sorted(expected.tolist())
        assert np.all(D[lims[i] : lims[i + 1]] > 0.8)
    assert lims[-1] == len(D) == len(I) > 0


def test_turboquant_reconstruct_is_the_quantizers_dequantize(small_clustered_data):
    base, _ = small_clustered_data
    index = TurboQuantIndex(base.shape[1], 3, variant="prod")
    index.add(base)
    expected = index.quantizer.dequantize(index.quantizer.quantize(torch.from_numpy(base[7:8])))[0].numpy()
    np.testing.assert_allclose(index.reconstruct(7), expected, atol=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize(("variant", "bits", "dim"), [("mse", 4, 64), ("mse", 6, 64), ("prod", 4, 300), ("prod", 2, 64)])
def test_cuda_index_keeps_codes_and_search_on_the_gpu(variant, bits, dim):
    """Every variant and dimension (Triton kernel or torch path) searches codes resident on the GPU and
    answers like the CPU index on the same codes; CUDA queries get CUDA answers."""
    rng = np.random.default_rng(0)
    base = rng.standard_normal((2000, dim)).astype(np.float32)
    queries = torch.from_numpy(rng.standard_normal((20, dim)).astype(np.float32)).cuda()
    gpu = TurboQuantIndex(dim, bits, variant=variant, device="cuda")
    gpu.add(torch.from_numpy(base).cuda())
    assert gpu.search_path == "device" and all(a.is_cuda for a in gpu._stored().values())
    cpu = TurboQuantIndex(dim, bits, variant=variant, scorer="dense", backend="torch")
    cpu.load_state_arrays(gpu.state_arrays())
    D, I = gpu.search(queries, 5)
    assert D.is_cuda and I.is_cuda
    reference = cpu.scores(queries.cpu().numpy())
    tolerance = 3e-3 * np.abs(reference).max()  # the Triton kernels decode in fp16
    np.testing.assert_allclose(D.cpu().numpy(), -np.sort(-reference, axis=1)[:, :5], rtol=0, atol=tolerance)
