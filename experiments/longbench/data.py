"""Which LongBench(-E) samples an experiment runs on: the real data (hub / local) or the embedded default.

A ``longbench_data`` config (``configs/longbench_data/*.yaml``) says ``source``:

* ``embedded``: LongBench-style tasks built here from real shipped data (:mod:`experiments.longbench.builders`);
  a substitute, labelled as such everywhere.
* ``local``: LongBench's jsonl files (or its data.zip) at ``path``.
* ``hub``: ``THUDM/LongBench`` from the Hugging Face hub (``repo_id``, optional ``revision``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from experiments.longbench.builders import SUBSTITUTES, TokenCounter, build_samples
from experiments.longbench.data_real import HUB_REPO, load_hub, load_local
from experiments.longbench.sample import LongBenchSample
from experiments.longbench.sources import sources_provenance

__all__ = ["DataSpec", "data_spec_from_config", "load_samples", "describe_data"]

_SOURCES = ("embedded", "local", "hub")


@dataclass(frozen=True)
class DataSpec:
    """Where the samples come from (one ``configs/longbench_data/*.yaml``)."""

    name: str
    source: str
    display_name: str
    path: str | None = None
    repo_id: str = HUB_REPO
    revision: str | None = None
    variant_e: bool = True

    def __post_init__(self) -> None:
        if self.source not in _SOURCES:
            raise ValueError(f"longbench_data.source must be one of {_SOURCES}, got {self.source!r}")
        if self.source == "local" and not self.path:
            raise ValueError("longbench_data.source=local needs longbench_data.path (a folder of jsonl files or data.zip)")

    @property
    def is_substitute(self) -> bool:
        return self.source == "embedded"


def data_spec_from_config(cfg: Mapping[str, Any]) -> DataSpec:
    cfg = dict(cfg)
    known = set(DataSpec.__dataclass_fields__) | {"description"}
    unknown = sorted(set(cfg) - known)
    if unknown:
        raise ValueError(f"longbench_data config has unknown keys {unknown}; known: {sorted(known)}")
    cfg.pop("description", None)
    return DataSpec(**cfg)


def load_samples(
    spec: DataSpec,
    dataset: str,
    n_samples: int,
    context_tokens: Sequence[int],
    seed: int,
    count_tokens: TokenCounter,
) -> list[LongBenchSample]:
    """The first ``n_samples`` samples of ``dataset`` (all of them for real data with fewer)."""
    if spec.source == "embedded":
        return build_samples(dataset, n_samples, context_tokens, seed, count_tokens)
    if spec.source == "local":
        samples = load_local(spec.path, dataset, spec.variant_e)  # type: ignore[arg-type]
    else:
        samples = load_hub(dataset, spec.variant_e, spec.repo_id, spec.revision)
    return samples[:n_samples]


def describe_data(spec: DataSpec) -> dict[str, Any]:
    """Provenance of the data: what it is, and for the embedded default what stands in for each dataset."""
    if spec.is_substitute:
        return {
            "data": spec.display_name,
            "data_substitution": "LongBench-style tasks from real shipped data instead of THUDM/LongBench (LongBench-E)",
            "data_sources": sources_provenance(),
            "data_substitutes": dict(SUBSTITUTES),
        }
    where = spec.path if spec.source == "local" else f"{spec.repo_id}@{spec.revision or 'main'} (hub)"
    return {"data": spec.display_name, "data_substitution": "", "data_sources": {"longbench": where}}
