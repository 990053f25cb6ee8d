"""Real text embedded by a shipped sentence model, with a content-addressed on-disk cache.

The texts are split into chunks of ``CHUNK_SIZE`` consecutive texts; each chunk's embeddings are saved
under a key hashing the model id and the chunk's exact texts. So a second load re-embeds nothing, a
changed model, corpus, sample seed or text never reuses a wrong file, a larger request embeds only the
new chunks, and a killed build resumes from its last finished chunk.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from tqdm import tqdm

from experiments.data.cache import cache_root, save_array_atomically
from experiments.data.shipped import MINILM_L6_V2, ShippedPackage
from experiments.data.source import SourceVectors, sample_rows
from experiments.data.text_corpora import sample_texts

CHUNK_SIZE = 1000  # texts per cache file (about 9 s of MiniLM on 2 cores)
BATCH_SIZE = 64  # texts per forward pass


class SentenceEncoder(Protocol):
    """Maps texts to an (len(texts), dim) array. ``model_id`` identifies the model in cache keys."""

    model_id: str

    def encode(self, texts: Sequence[str]) -> np.ndarray: ...


class ShippedSentenceTransformer:
    """A sentence-transformers model whose files ship inside a pip package; loaded on first use, offline."""

    def __init__(self, package: ShippedPackage, model_subdir: str, name: str):
        self.package, self.model_subdir, self.name = package, model_subdir, name
        self.model_id = f"{name} ({package.distribution}=={package.version()})"
        self._model: Any = None

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        if self._model is None:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            try:
                from sentence_transformers import SentenceTransformer
            except ImportError as err:
                raise ModuleNotFoundError(
                    f"{self.name} needs sentence-transformers: `pip install sentence-transformers` (check with "
                    f"`pip install --dry-run` first that it keeps the installed torch)", name="sentence_transformers"
                ) from err

            self._model = SentenceTransformer(str(self.package.folder() / self.model_subdir), device="cpu")
        return self._model.encode(list(texts), batch_size=BATCH_SIZE, convert_to_numpy=True).astype(np.float32)


def make_encoder(model: str) -> SentenceEncoder:
    """The encoder named in a dataset config (``model:``)."""
    if model == "all-MiniLM-L6-v2":
        return ShippedSentenceTransformer(MINILM_L6_V2, "model", model)
    raise ValueError(f"unknown sentence model {model!r}; known: ['all-MiniLM-L6-v2']")


def load_sentence_embeddings(cfg: Mapping[str, Any], n_total: int, seed: int) -> SourceVectors:
    """Embed the first ``n_total`` texts of the config's sampled corpus; ``seed`` shuffles their order."""
    sample = sample_texts(str(cfg["texts"]), n_total, int(cfg.get("sample_seed", 0)))
    encoder = make_encoder(str(cfg["model"]))
    vectors = embed_with_cache(sample.texts, encoder, cache_root() / "sentence-embeddings")
    rows = sample_rows(n_total, n_total, seed, what=f"dataset {cfg['name']!r}")
    source = {"model": encoder.model_id, "texts": {"corpus": cfg["texts"], **sample.source}, "n_texts": n_total}
    return SourceVectors(vectors[rows], source)


def embed_with_cache(texts: Sequence[str], encoder: SentenceEncoder, cache_dir: Path) -> np.ndarray:
    """Embeddings of ``texts`` (len(texts), dim) float32, computed chunk by chunk and cached on disk."""
    chunks = [texts[start : start + CHUNK_SIZE] for start in range(0, len(texts), CHUNK_SIZE)]
    blocks: list[np.ndarray] = []
    with tqdm(total=len(texts), desc=f"embedding with {encoder.model_id}", unit="text") as progress:
        for chunk in chunks:
            path = cache_dir / f"{_chunk_key(encoder.model_id, chunk)}.npy"
            block = _load_cached_chunk(path, len(chunk))
            if block is None:
                block = _encode_chunk(chunk, encoder, progress)
                save_array_atomically(path, block)
            else:
                progress.update(len(chunk))
            blocks.append(block)
    return np.concatenate(blocks)


def _chunk_key(model_id: str, texts: Sequence[str]) -> str:
    digest = hashlib.sha256(model_id.encode("utf-8"))
    for text in texts:
        digest.update(b"\0" + text.encode("utf-8"))
    return digest.hexdigest()[:40]


def _load_cached_chunk(path: Path, n_texts: int) -> np.ndarray | None:
    """The cached block, or None if absent or unusable (wrong length, non-finite): then it is rebuilt."""
    if not path.is_file():
        return None
    block = np.load(path)
    if block.ndim != 2 or block.shape[0] != n_texts or not np.isfinite(block).all():
        return None
    return block


def _encode_chunk(chunk: Sequence[str], encoder: SentenceEncoder, progress: tqdm) -> np.ndarray:
    parts = []
    for start in range(0, len(chunk), BATCH_SIZE):
        parts.append(np.asarray(encoder.encode(chunk[start : start + BATCH_SIZE]), dtype=np.float32))
        progress.update(len(parts[-1]))
    return np.concatenate(parts)
