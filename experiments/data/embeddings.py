"""One loader for every embedding set used by the distortion and nearest-neighbour experiments.

    ds = load_embeddings(cfg.dataset, n_base=20_000, n_queries=1_000, seed=0)
    ds.base (n_base, dim) float32, ds.queries (n_queries, dim) float32, ds.description, ds.substitution

The paper's data (arXiv v1, Sec. 4): DBpedia entities embedded by OpenAI text-embedding-3-large at
d = 1536 and 3072 (100,000 vectors quantized, 1,000 held-out queries), and GloVe d = 200 (100,000
base vectors, 10,000 queries). OpenAI embeddings are unit-norm; GloVe vectors are not. This loader
returns the raw vectors, never normalised: experiments that need unit vectors normalise themselves.

A dataset config (``configs/dataset/<name>.yaml``) names a ``loader`` (see ``LOADERS``), the native
``dim`` of its vectors (checked), a human ``label``, an optional ``substitution`` (what it stands in for,
printed in figure titles and reports) and optionally ``lift_dim``: map the vectors into that higher
dimension by a fixed Haar isometry (``experiments.data.isometry``).

Queries are held out: ``n_base + n_queries`` distinct rows are drawn in a seeded random order, the
first ``n_queries`` become the queries and the rest the base set, so no query row is in the base.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from experiments.data import glove, openai_parquet, sentence_embeddings, synthetic
from experiments.data.isometry import lift
from experiments.data.source import SourceVectors, check_vectors

Loader = Callable[[Mapping[str, Any], int, int], SourceVectors]

LOADERS: dict[str, Loader] = {
    "random_sphere": synthetic.load_random_sphere,
    "shipped_glove": glove.load_shipped_glove,
    "glove_text": glove.load_glove_text,
    "openai_parquet": openai_parquet.load_openai_parquet,
    "sentence_embeddings": sentence_embeddings.load_sentence_embeddings,
}


@dataclass(frozen=True)
class EmbeddingDataset:
    """Base vectors and disjoint held-out queries, with what they are and where they came from.

    ``description`` names the data actually used (for figure titles); ``substitution`` says what it
    stands in for (None for the paper's own data); ``source`` records package/version, hub id or path.
    """

    name: str
    dim: int
    base: np.ndarray
    queries: np.ndarray
    description: str
    substitution: str | None
    source: dict[str, Any]

    @property
    def n_base(self) -> int:
        return self.base.shape[0]

    @property
    def n_queries(self) -> int:
        return self.queries.shape[0]

    def provenance(self) -> dict[str, Any]:
        """What a run records about its data (see :func:`dataset_provenance`)."""
        return dataset_provenance(self)


def dataset_provenance(data: Any) -> dict[str, Any]:
    """Name, description, substitution, sizes and source of a dataset-like object (numpy or torch rows)."""
    return {
        "dataset": data.name,
        "description": data.description,
        "substitution": data.substitution,
        "dim": int(data.base.shape[1]),
        "n_base": int(data.base.shape[0]),
        "n_queries": int(data.queries.shape[0]),
        "source": data.source,
    }


def load_embeddings(
    dataset_cfg: Mapping[str, Any],
    n_base: int | None = None,
    n_queries: int | None = None,
    seed: int = 0,
) -> EmbeddingDataset:
    """Load ``n_base`` base vectors and ``n_queries`` disjoint queries of the configured dataset.

    ``n_base``/``n_queries`` default to the config's ``n_base``/``n_queries``; ``seed`` chooses which
    rows are drawn and which of them are queries (the dataset's own content, e.g. the sampled texts of
    an embedded set, is fixed by the config so caches are shared across seeds).
    """
    cfg = dict(dataset_cfg.items())
    for key in ("name", "loader", "dim"):
        if cfg.get(key) is None:
            raise ValueError(f"dataset config lacks {key!r}: {cfg}")
    if cfg["loader"] not in LOADERS:
        raise ValueError(f"dataset {cfg['name']!r}: unknown loader {cfg['loader']!r}; known: {sorted(LOADERS)}")
    n_base = int(cfg["n_base"] if n_base is None else n_base)
    n_queries = int(cfg["n_queries"] if n_queries is None else n_queries)
    if n_base < 1 or n_queries < 1:
        raise ValueError(f"dataset {cfg['name']!r}: need n_base >= 1 and n_queries >= 1, got {n_base}, {n_queries}")

    loaded = LOADERS[cfg["loader"]](cfg, n_base + n_queries, seed)
    vectors = check_vectors(loaded.vectors, int(cfg["dim"]), what=f"dataset {cfg['name']!r}")
    lift_dim, lift_seed = cfg.get("lift_dim"), int(cfg.get("lift_seed", 0))
    if lift_dim is not None:
        vectors = lift(vectors, int(lift_dim), lift_seed)

    return EmbeddingDataset(
        name=cfg["name"],
        dim=vectors.shape[1],
        base=vectors[n_queries:],
        queries=vectors[:n_queries],
        description=_description(cfg, n_base, n_queries),
        substitution=_substitution(cfg),
        source={**loaded.source, **({"lift_dim": int(lift_dim), "lift_seed": lift_seed} if lift_dim else {})},
    )


def _description(cfg: Mapping[str, Any], n_base: int, n_queries: int) -> str:
    label = cfg.get("label") or cfg["name"]
    lifted = f", lifted to {cfg['lift_dim']}-d" if cfg.get("lift_dim") else ""
    return f"{label}{lifted} ({n_base:,} base, {n_queries:,} queries)"


def _substitution(cfg: Mapping[str, Any]) -> str | None:
    parts = [cfg["substitution"]] if cfg.get("substitution") else []
    if cfg.get("lift_dim"):
        d, big_d = int(cfg["dim"]), int(cfg["lift_dim"])
        parts.append(
            f"Lifted from {d}-d to {big_d}-d by a fixed Haar isometry (seed {int(cfg.get('lift_seed', 0))}): "
            f"norms, inner products and neighbours are preserved exactly, so TurboQuant's rotated coordinates "
            f"behave as for any vectors of dimension {big_d}; the data still lie in a {d}-d subspace, so PQ "
            f"and RaBitQ do not see the structure of real {big_d}-d embeddings."
        )
    return " ".join(parts) or None
