"""The fast-scan path's recall equals the dense scorer's on real embeddings (issue 17): GloVe-50, MiniLM-DBpedia
and its Haar lift to 1536-d (the case where faiss's 16-bit accumulator used to wrap), on small held-out subsets of
the shipped data. Skipped with the install command where a data package is absent."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hydra import compose, initialize_config_dir

pytest.importorskip("faiss")

from experiments.data import load_embeddings  # noqa: E402
from experiments.data.shipped import DBPEDIA_ENTITIES, GLOVE_6B_50D, MINILM_L6_V2  # noqa: E402
from run import REPO_ROOT  # noqa: E402
from turboquant.ann import TurboQuantIndex, recall_at_1_at_k  # noqa: E402

DATASETS = {"glove50": (GLOVE_6B_50D,), "dbpedia_minilm": (DBPEDIA_ENTITIES, MINILM_L6_V2),
            "dbpedia_minilm_lift1536": (DBPEDIA_ENTITIES, MINILM_L6_V2)}
KS = [1, 10, 100]


@functools.lru_cache(maxsize=None)
def _subset(name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """4000 base rows and 200 held-out queries (unit-normalised, as ann_recall does) and the true top-1."""
    missing = [p.install_command for p in DATASETS[name] if not p.is_installed()]
    if missing:
        pytest.skip(f"needs {' and '.join(missing)}")
    with initialize_config_dir(str(REPO_ROOT / "configs"), version_base=None):
        cfg = compose("config", overrides=[f"dataset={name}"]).dataset
    data = load_embeddings(cfg, n_base=4000, n_queries=200, seed=0)
    base, queries = (x / np.linalg.norm(x, axis=1, keepdims=True) for x in (data.base, data.queries))
    return base, queries, np.argmax(queries @ base.T, axis=1)


@pytest.mark.parametrize("name", list(DATASETS))
@pytest.mark.parametrize(("variant", "bits"), [("mse", 2), ("mse", 4), ("prod", 2), ("prod", 4)])
def test_fastscan_recall_equals_the_dense_scorers_on_real_data(name, variant, bits):
    base, queries, truth = _subset(name)
    fast = TurboQuantIndex(base.shape[1], bits, variant=variant, rotation="hadamard", scorer="fastscan")
    fast.add(base)
    dense = TurboQuantIndex(**{**fast.config(), "scorer": "dense"})
    dense.load_state_arrays(fast.state_arrays())
    fast_recall = recall_at_1_at_k(truth, fast.search(queries, max(KS))[1], KS)
    dense_recall = recall_at_1_at_k(truth, dense.search(queries, max(KS))[1], KS)
    assert fast_recall == dense_recall
    assert dense_recall[1] > 0.1  # the data are the real embeddings, not noise
