"""Where derived data (sampled texts, sentence embeddings) is cached between runs."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from turboquant.codebook import cache_dir


def cache_root() -> Path:
    """``$TURBOQUANT_CACHE_DIR`` if set, else the user cache dir (e.g. ~/.cache/turboquant-repro): the library's
    own cache folder (:func:`turboquant.codebook.cache_dir`), shared by codebooks, data and converted models."""
    return cache_dir()


@contextlib.contextmanager
def file_lock(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``lock_path`` (created if absent) for the ``with`` block: processes that
    share a folder (a result store, a sample cache) take turns, and a killed holder releases it."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


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
