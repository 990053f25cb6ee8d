"""Where derived data (sampled texts, sentence embeddings) is cached between runs."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from turboquant.codebook import cache_dir


def cache_root() -> Path:
    """``$TURBOQUANT_CACHE_DIR`` if set, else the user cache dir (e.g. ~/.cache/turboquant-repro): the library's
    own cache folder (:func:`turboquant.codebook.cache_dir`), shared by codebooks, data and converted models."""
    return cache_dir()


def save_array_atomically(path: Path, array: np.ndarray) -> None:
    """Write ``array`` to ``path`` (.npy) via a temporary file so a killed run never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp.npy")
    np.save(tmp, array)
    os.replace(tmp, path)


def save_text_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
