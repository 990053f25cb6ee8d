"""The paper's DBpedia sets: OpenAI text-embedding-3-large vectors in Qdrant's parquet shards.

Hugging Face datasets ``Qdrant/dbpedia-entities-openai3-text-embedding-3-large-{1536,3072}-1M``: 1M
DBpedia entities in parquet shards ``data/train-000NN-of-000MM.parquet`` with columns ``_id``,
``title``, ``text`` and the embedding, a list of floats, in ``text-embedding-3-large-1536-embedding``
(resp. ``-3072-embedding``). The vectors are unit-norm.

Read from ``cfg.path`` (a parquet file, or a folder searched recursively, e.g. the ``--local-dir`` of
``hf download``) or, when no path is set, downloaded shard by shard from the hub (only as many shards as
the requested rows need; ``huggingface_hub`` is imported only then).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from experiments.data.source import SourceVectors, sample_rows


def load_openai_parquet(cfg: Mapping[str, Any], n_total: int, seed: int) -> SourceVectors:
    """A seeded random sample of ``n_total`` rows from the first shards that hold at least that many."""
    column, dim = str(cfg["column"]), int(cfg["dim"])
    if cfg.get("path"):
        path = Path(str(cfg["path"])).expanduser()
        files: Iterable[Path] = local_parquet_files(path, dataset=str(cfg["name"]))
        source: dict[str, Any] = {"path": str(path), "column": column}
    else:
        files = hub_parquet_files(str(cfg["hub_id"]), cfg.get("revision"), dataset=str(cfg["name"]))
        source = {"hub_id": str(cfg["hub_id"]), "revision": cfg.get("revision") or "main", "column": column}
    pool, used = read_embedding_column(files, column, dim, min_rows=n_total)
    rows = sample_rows(pool.shape[0], n_total, seed, what=f"dataset {cfg['name']!r} ({len(used)} parquet file(s))")
    return SourceVectors(pool[rows], {**source, "files": [str(f) for f in used]})


def local_parquet_files(path: Path, dataset: str) -> list[Path]:
    """The parquet files at ``path`` (a file, or every ``*.parquet`` below a folder), sorted by name."""
    if path.is_file():
        return [path]
    files = sorted(path.rglob("*.parquet")) if path.is_dir() else []
    if not files:
        raise ValueError(f"dataset {dataset!r}: no parquet file at dataset.path={path}")
    return files


def hub_parquet_files(hub_id: str, revision: str | None, dataset: str) -> Iterator[Path]:
    """Download the dataset's parquet shards one at a time, in name order, as the reader asks for them."""
    hint = (
        f"download it (`hf download {hub_id} --repo-type dataset --local-dir DIR`) and set dataset.path=DIR"
    )
    try:
        from huggingface_hub import HfApi, hf_hub_download
    except ImportError as err:
        raise ValueError(f"dataset {dataset!r}: dataset.path is not set and huggingface_hub is not installed; {hint}") from err
    try:
        names = HfApi().list_repo_files(hub_id, repo_type="dataset", revision=revision)
        for name in sorted(n for n in names if n.endswith(".parquet")):
            yield Path(hf_hub_download(hub_id, name, repo_type="dataset", revision=revision))
    except Exception as err:  # any hub/network failure gets the same instruction
        raise ValueError(
            f"dataset {dataset!r}: dataset.path is not set and the Hugging Face hub could not be read "
            f"({type(err).__name__}: {err}); {hint}"
        ) from err


def read_embedding_column(
    files: Iterable[Path], column: str, dim: int, min_rows: int
) -> tuple[np.ndarray, list[Path]]:
    """Read the list-of-float ``column`` of the files in order until at least ``min_rows`` rows.

    Returns the (rows, dim) float32 matrix and the files read. ValueError for a missing column or a
    vector whose length is not ``dim``; NaNs are passed through for the caller's finiteness check.
    """
    import pyarrow.parquet as pq

    blocks: list[np.ndarray] = []
    used: list[Path] = []
    n_rows = 0
    for file in files:
        parquet = pq.ParquetFile(file)
        if column not in parquet.schema_arrow.names:
            raise ValueError(f"{file}: no column {column!r}; columns are {parquet.schema_arrow.names}")
        used.append(Path(file))
        for batch in parquet.iter_batches(columns=[column], batch_size=8192):
            blocks.append(_list_column_to_matrix(batch.column(0), dim, where=f"{file}, column {column!r}"))
            n_rows += blocks[-1].shape[0]
            if n_rows >= min_rows:
                return np.concatenate(blocks), used
    if not blocks:
        raise ValueError(f"no rows found in column {column!r} of {[str(f) for f in used]}")
    return np.concatenate(blocks), used


def _list_column_to_matrix(array: Any, dim: int, where: str) -> np.ndarray:
    import pyarrow.compute as pc

    if array.null_count:
        raise ValueError(f"{where}: {array.null_count} row(s) have no embedding (null)")
    lengths = pc.list_value_length(array).to_numpy(zero_copy_only=False)
    wrong = np.flatnonzero(lengths != dim)
    if wrong.size:
        raise ValueError(f"{where}: embedding of length {lengths[wrong[0]]}, expected dim={dim}")
    values = array.flatten().to_numpy(zero_copy_only=False)
    return values.astype(np.float32, copy=False).reshape(len(array), dim)
