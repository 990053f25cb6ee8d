"""TurboQuantIndex's kernel search path (the quantizer's Triton inner_product, as on a GPU), run under
Triton's CPU interpreter when no CUDA device is present; small sizes, the interpreter is slow."""
import os

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # read when the kernels are decorated, i.e. on first use

pytest.importorskip("triton")

from turboquant.ann import TurboQuantIndex, load_index

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BACKEND = "auto" if torch.cuda.is_available() else "triton"


@pytest.mark.parametrize(("variant", "bits", "rotation"), [("mse", 4, "hadamard"), ("mse", 2, "haar"), ("prod", 3, "haar")])
def test_kernel_search_matches_the_host_scorer(tmp_path, variant, bits, rotation):
    rng = np.random.default_rng(bits)
    base = rng.standard_normal((300, 48)).astype(np.float32)
    queries = rng.standard_normal((7, 48)).astype(np.float32)
    kernel = TurboQuantIndex(48, bits, variant=variant, rotation=rotation, backend=BACKEND, device=DEVICE,
                             chunk_size=128, query_block=4)
    assert kernel.kernel_search
    kernel.add(base)
    host = TurboQuantIndex(48, bits, variant=variant, rotation=rotation, backend="torch", chunk_size=128)
    assert not host.kernel_search
    host.load_state_arrays(kernel.state_arrays())  # the same codes behind the host scorer
    reference = host.scores(queries)
    fp16 = 3e-3 * np.abs(reference).max()  # the kernel decodes centroids and multiplies in fp16
    np.testing.assert_allclose(kernel.scores(queries), reference, rtol=0, atol=fp16)
    (found_scores, found_ids), (expected_scores, _) = kernel.search(queries, 5), host.search(queries, 5)
    np.testing.assert_allclose(found_scores, expected_scores, rtol=0, atol=fp16)
    # the ids found are the host's top 5 up to scores within fp16 error of the 5th best
    fifth = np.sort(reference, axis=1)[:, -5]
    assert all(reference[row, found_ids[row]].min() >= fifth[row] - 2 * fp16 for row in range(len(queries)))
    loaded = load_index(kernel.save(tmp_path / "kernel.npz"))
    assert loaded.kernel_search and loaded.config() == kernel.config()
    np.testing.assert_array_equal(loaded.search(queries, 5)[1], found_ids)
