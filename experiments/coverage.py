"""Which part of its config's grid a run covered: full runs make the paper figures and verdicts, reduced
runs are labelled "partial".

The *config's grid* of a run is what ``configs/experiment/<name>.yaml`` composes to at the run's scale
(``python run.py experiment=<name> scale=<scale>`` without overrides). A run is *reduced* when its
``experiment`` node leaves out part of that grid:

* a list entry of the grid is missing (fewer contexts, depths, bits, seeds, data sets, ...);
* a mapping key of the grid is missing (a dropped method: ``'~experiment.methods.snapkv'``);
* a sample size is smaller: a number in the scale's ``sizes`` block, or a number whose key names a count
  (``n_*``, ``samples*``, ``seeds``, ``repeats``) anywhere in the node.

A run is also reduced when its stored rows leave out units of its grid (a run cut short at a time limit and
not resumed yet): :func:`frame_coverage` adds that to the config's reductions.

Anything else (other sizes of other scales, a larger grid, a changed option such as a rotation or a
chunk size) is not a reduction: a larger run still covers the grid, and a variant is told apart by its
figure and result names. :func:`grid_coverage` takes a composed config or the resolved config a run
record stores, so figures (:func:`experiments.plotting.save_figure`) and verdicts
(:mod:`experiments.compare`) apply the same rule.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from experiments.io import config_to_dict

__all__ = ["CONFIG_DIR", "GridCoverage", "Reduction", "default_experiment_config", "frame_coverage", "grid_coverage",
           "record_config", "reductions"]

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"

#: Keys whose numbers count samples wherever they appear (outside ``sizes`` too, e.g. ip_histogram's bias.seeds).
_COUNT_KEY = re.compile(r"^(n_|samples|seeds$|repeats$)")


@dataclass(frozen=True)
class Reduction:
    """One part of the grid a run left out: the dotted config path and what is missing there."""

    path: str
    what: str

    def __str__(self) -> str:
        return f"{self.path}: {self.what}"


@dataclass(frozen=True)
class GridCoverage:
    """The reductions of one run against its config's grid (empty: the run covers the full grid)."""

    reduced: tuple[Reduction, ...] = ()

    @property
    def full(self) -> bool:
        return not self.reduced

    def stem(self, name: str) -> str:
        """A figure / table file stem: ``name`` for a full run, ``name_partial`` for a reduced one."""
        return name if self.full else f"{name}_partial"

    def title(self, title: str) -> str:
        """``title`` for a full run; for a reduced one, prefixed by a line saying what the run left out."""
        return title if self.full else f"PARTIAL RUN, not the config's grid ({self.summary()})\n{title}"

    def summary(self, limit: int = 3) -> str:
        shown = "; ".join(map(str, self.reduced[:limit]))
        return shown + (f"; and {len(self.reduced) - limit} more" if len(self.reduced) > limit else "")


@lru_cache(maxsize=32)
def _default_experiment_json(name: str, scale: str) -> str:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if not (CONFIG_DIR / "experiment" / f"{name}.yaml").exists():
        raise ValueError(f"no configs/experiment/{name}.yaml: experiment {name!r} has no grid to cover")
    overrides = [f"experiment={name}", f"scale={scale}"]
    if GlobalHydra.instance().is_initialized():  # inside run.py's @hydra.main (or a test's initialize block)
        cfg = compose(config_name="config", overrides=overrides)
    else:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
            cfg = compose(config_name="config", overrides=overrides)
    return json.dumps(config_to_dict(cfg)["experiment"], sort_keys=True)


def default_experiment_config(name: str, scale: str) -> dict[str, Any]:
    """The ``experiment`` node that ``experiment=<name> scale=<scale>`` composes to (no other overrides)."""
    return json.loads(_default_experiment_json(name, scale))


def _key(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def reductions(grid: Any, run: Any, path: str, scale: str, in_sizes: bool = False) -> list[Reduction]:
    """What ``run`` leaves out of ``grid`` under ``path`` (see the module docstring for the rule)."""
    if isinstance(grid, Mapping):
        if not isinstance(run, Mapping):
            return [Reduction(path, f"{_key(run)} instead of {_key(grid)}")]
        found = []
        for key, value in grid.items():
            sub = f"{path}.{key}"
            if path.endswith(".sizes") and key != scale:
                continue  # the other scales' sizes are not this run's grid
            if key not in run:
                found.append(Reduction(sub, "dropped"))
                continue
            found += reductions(value, run[key], sub, scale, in_sizes or path.endswith(".sizes"))
        return found
    if isinstance(grid, Sequence) and not isinstance(grid, str):
        have = {_key(v) for v in run} if isinstance(run, Sequence) and not isinstance(run, str) else {_key(run)}
        missing = [v for v in grid if _key(v) not in have]
        return [Reduction(path, f"{len(grid) - len(missing)} of {len(grid)} entries (no {', '.join(map(_key, missing))})")] \
            if missing else []
    name = path.rsplit(".", 1)[-1]
    if _is_number(grid) and _is_number(run) and (in_sizes or _COUNT_KEY.match(name)) and run < grid:
        return [Reduction(path, f"{run:g} < {grid:g}")]
    return []


def _union(a: Any, b: Any) -> Any:
    """What two configs cover together: mappings by key (recursively), lists as the union of their entries (in
    order of first appearance), numbers as the larger; any other value is the first config's."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return {**b, **{key: _union(value, b[key]) if key in b else value for key, value in a.items()}}
    if isinstance(a, Sequence) and not isinstance(a, str) and isinstance(b, Sequence) and not isinstance(b, str):
        seen = {_key(v) for v in a}
        return [*a, *(v for v in b if _key(v) not in seen)]
    if _is_number(a) and _is_number(b):
        return max(a, b)
    return a


def record_config(record: Mapping[str, Any]) -> dict[str, Any]:
    """The config a run record covers: the union (:func:`_union`) of every invocation's config stored under its
    ``configs`` (processes that each ran a subset of the methods or contexts into one store), else its ``config``."""
    configs = [entry["config"] for entry in (record.get("configs") or {}).values()]
    if not configs:
        return dict(record.get("config") or {})
    merged = configs[0]
    for config in configs[1:]:
        merged = _union(merged, config)
    return merged


def grid_coverage(config: Any) -> GridCoverage:
    """The coverage of a run with this config (a DictConfig or the resolved mapping of a run record)."""
    tree = config_to_dict(config)
    experiment, scale = tree.get("experiment") or {}, (tree.get("scale") or {}).get("name")
    name = experiment.get("name")
    if not name or not scale:
        raise ValueError("a run's config needs experiment.name and scale.name to be judged against its grid")
    try:
        grid = default_experiment_config(str(name), str(scale))
    except ValueError as err:
        return GridCoverage((Reduction("experiment", str(err)),))
    return GridCoverage(tuple(reductions(grid, experiment, "experiment", str(scale))))


def frame_coverage(config: Any, frame: Any) -> GridCoverage:
    """:func:`grid_coverage` of ``config``, plus the units of its grid that ``frame`` has no rows for (the
    ``frame.attrs["units"]`` that :meth:`experiments.io.ResultStore.frame` sets when asked for units)."""
    coverage = grid_coverage(config)
    units = getattr(frame, "attrs", {}).get("units") or {}
    if units.get("missing"):
        stored = units["asked"] - units["missing"]
        return GridCoverage((*coverage.reduced, Reduction("results", f"{stored} of {units['asked']} units stored")))
    return coverage
