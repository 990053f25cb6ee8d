import numpy as np
import pytest


def _clustered(seed: int, dim: int, n_base: int, n_centres: int, spread: float):
    """Unit vectors around ``n_centres`` Gaussian centres (noise ``spread``), and 200 held-out queries drawn near
    the same centres; float32."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((n_centres, dim))
    base = centres[rng.integers(0, n_centres, n_base)] + spread * rng.standard_normal((n_base, dim))
    queries = centres[rng.integers(0, n_centres, 200)] + spread * rng.standard_normal((200, dim))
    base /= np.linalg.norm(base, axis=1, keepdims=True)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    return base.astype(np.float32), queries.astype(np.float32)


@pytest.fixture(scope="module")
def clustered_data():
    """Unit vectors with structure (a few hundred clusters), plus held-out queries drawn near them."""
    return _clustered(0, dim=64, n_base=4000, n_centres=200, spread=0.6)


@pytest.fixture(scope="module")
def small_clustered_data():
    """16-d version of ``clustered_data`` (k-means training of the faiss baselines stays fast)."""
    return _clustered(1, dim=16, n_base=1500, n_centres=100, spread=0.4)
