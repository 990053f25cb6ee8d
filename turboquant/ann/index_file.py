"""The saved-index file: one ``.npz`` (no pickle) holding JSON metadata, the index's arrays and a checksum.

Entries: ``meta`` (UTF-8 JSON: method, constructor config, is_trained), one entry per state array, and
``checksum``: the SHA-256 of the metadata and of every array's name, dtype, shape and bytes, so that an
edited value (a seed, a code byte, a norm) is detected on read instead of answering queries wrongly.

:func:`read_index_file` turns every way a file can be unreadable (missing, truncated, not a zip, random
bytes, a missing entry, bad JSON, a checksum mismatch, object arrays) into an :class:`IndexFileError`
naming the file; what the arrays must look like for a given method is checked by the index class
(``VectorIndex.check_saved``) before anything is built from them.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["IndexFileError", "read_index_file", "write_index_file"]

_RESERVED = ("meta", "checksum")


class IndexFileError(ValueError):
    """A saved index file that cannot be read back faithfully; the message names the file."""


def _digest(meta_bytes: bytes, arrays: dict[str, np.ndarray]) -> str:
    sha = hashlib.sha256(meta_bytes)
    for name in sorted(arrays):
        array = np.ascontiguousarray(arrays[name])
        sha.update(f"{name}|{array.dtype.str}|{array.shape}|".encode())
        sha.update(array.tobytes())
    return sha.hexdigest()


def write_index_file(path: str | Path, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> Path:
    """Write ``meta`` and ``arrays`` to ``path`` (``.npz`` appended if missing); returns the path."""
    path = Path(path)
    if path.suffix != ".npz":
        path = path.with_suffix(path.suffix + ".npz")
    clash = set(_RESERVED) & set(arrays)
    if clash:
        raise ValueError(f"{sorted(clash)} are reserved entry names in saved index files")
    path.parent.mkdir(parents=True, exist_ok=True)
    meta_bytes = json.dumps(meta, sort_keys=True).encode()
    checksum = _digest(meta_bytes, arrays).encode()
    np.savez(path, meta=np.frombuffer(meta_bytes, np.uint8), checksum=np.frombuffer(checksum, np.uint8), **arrays)
    return path


def read_index_file(path: str | Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """``(meta, arrays)`` of a file written by :func:`write_index_file`, integrity-checked.

    Raises :class:`IndexFileError` (naming ``path``) when the file is missing, not an ``.npz`` archive,
    truncated, lacks ``meta`` / ``checksum``, holds invalid metadata or object arrays, or fails the checksum.
    """
    path = Path(path)
    if not path.is_file():
        raise IndexFileError(f"no saved index at {path}")
    try:
        saved = np.load(path, allow_pickle=False)
        if not isinstance(saved, np.lib.npyio.NpzFile):
            raise IndexFileError(f"{path} is a bare .npy array, not a saved index (.npz archive)")
        with saved:
            arrays = {key: saved[key] for key in saved.files}
    except IndexFileError:
        raise
    except (zipfile.BadZipFile, EOFError, OSError, ValueError, KeyError) as error:
        raise IndexFileError(f"{path} is not a readable saved index (truncated, corrupted or not an .npz "
                             f"archive): {type(error).__name__}: {error}") from None
    missing = [key for key in _RESERVED if key not in arrays]
    if missing:
        raise IndexFileError(f"{path} is not a saved index: no {missing} entries")
    meta_bytes, stored = arrays.pop("meta"), arrays.pop("checksum")
    if meta_bytes.dtype != np.uint8 or stored.dtype != np.uint8:
        raise IndexFileError(f"{path}: 'meta' and 'checksum' must be uint8 byte strings")
    meta_bytes = meta_bytes.tobytes()
    if stored.tobytes() != _digest(meta_bytes, arrays).encode():
        raise IndexFileError(f"{path}: checksum mismatch: the file was modified or corrupted after it was saved")
    try:
        meta = json.loads(meta_bytes.decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise IndexFileError(f"{path}: metadata is not valid JSON ({error})") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("config"), dict) or "method" not in meta:
        raise IndexFileError(f"{path}: metadata must be an object with 'method' and 'config', got {meta!r:.200}")
    if not isinstance(meta.get("is_trained"), bool):
        raise IndexFileError(f"{path}: metadata 'is_trained' must be true or false, got {meta.get('is_trained')!r}")
    return meta, arrays
