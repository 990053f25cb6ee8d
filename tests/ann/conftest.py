import numpy as np
import pytest


@pytest.fixture(scope="module")
def clustered_data():
    """Unit vectors with structure (a few hundred clusters), plus held-out queries drawn near them."""
    rng = np.random.default_rng(0)
    dim, n_base, n_queries = 64, 4000, 200
    centres = rng.standard_normal((200, dim))
    base = centres[rng.integers(0, 200, n_base)] + 0.6 * rng.standard_normal((n_base, dim))
    queries = centres[rng.integers(0, 200, n_queries)] + 0.6 * rng.standard_normal((n_queries, dim))
    base /= np.linalg.norm(base, axis=1, keepdims=True)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    return base.astype(np.float32), queries.astype(np.float32)


@pytest.fixture(scope="module")
def small_clustered_data():
    """16-d version of ``clustered_data`` (k-means training of the faiss baselines stays fast)."""
    rng = np.random.default_rng(1)
    dim, n_base, n_queries = 16, 1500, 200
    centres = rng.standard_normal((100, dim))
    base = centres[rng.integers(0, 100, n_base)] + 0.4 * rng.standard_normal((n_base, dim))
    queries = centres[rng.integers(0, 100, n_queries)] + 0.4 * rng.standard_normal((n_queries, dim))
    base /= np.linalg.norm(base, axis=1, keepdims=True)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    return base.astype(np.float32), queries.astype(np.float32)
