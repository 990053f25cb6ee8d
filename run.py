"""Hydra entry point: config → ``experiments.<name>.run`` → results/ CSV → ``plot`` → figures/.

    python run.py experiment=distortion                       # quick scale, default dataset
    python run.py experiment=ip_histogram scale=paper dataset=dbpedia_openai3_1536
    python run.py -m experiment=distortion quantizer.rotation=haar,hadamard

Each experiment module provides ``run(cfg, store) -> pandas.DataFrame`` and
``plot(df, cfg, figures_dir) -> list[Path]``; optionally ``RESULT_KEYS`` (the dotted config paths
that determine its numbers, see :mod:`experiments.io`) and ``paper_comparison(df)`` (see
``scripts/compare_to_paper.py``). This file only wires them together.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import hydra
from omegaconf import DictConfig

from experiments.io import ResultStore

REPO_ROOT = Path(__file__).resolve().parent


@dataclass(frozen=True)
class RunOutputs:
    """Where one run's outputs went."""

    results_csv: Path
    config_json: Path
    figures: list[Path]
    n_rows: int


def resolve_path(path: str | Path, root: Path = REPO_ROOT) -> Path:
    """Relative config paths are anchored at the repository root, never at the working directory."""
    path = Path(path).expanduser()
    return path if path.is_absolute() else root / path


def load_experiment(name: str) -> ModuleType:
    """Import ``experiments.<name>`` and check it has the entry points run.py calls."""
    try:
        module = importlib.import_module(f"experiments.{name}")
    except ModuleNotFoundError as err:
        if err.name == f"experiments.{name}":
            raise ValueError(f"unknown experiment {name!r}: no module experiments/{name}.py") from err
        raise
    missing = [fn for fn in ("run", "plot") if not callable(getattr(module, fn, None))]
    if missing:
        raise ValueError(f"experiments.{name} lacks {missing}: every experiment defines run() and plot()")
    return module


def _multirun_subdir() -> str | None:
    """In a Hydra multirun, the job's overrides other than experiment/dataset/scale/paths (see
    ``hydra.job.config.override_dirname.exclude_keys`` in config.yaml), so that jobs differing in
    anything else (e.g. ``quantizer.rotation=haar,hadamard``) do not overwrite each other's figures;
    None (figures straight into figures_dir) outside a multirun or when nothing else is overridden,
    as in ``-m experiment=distortion,ip_histogram,ip_variance``."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return None
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode != RunMode.MULTIRUN:
        return None
    return hydra_cfg.job.override_dirname or None


def run_experiment(cfg: DictConfig, root: Path = REPO_ROOT) -> RunOutputs:
    """Run the configured experiment, store its rows, draw its figures."""
    name = cfg.experiment.name
    module = load_experiment(name)
    results_dir = resolve_path(cfg.paths.results_dir, root)
    figures_dir = resolve_path(cfg.paths.figures_dir, root)
    subdir = _multirun_subdir()
    if subdir:
        figures_dir = figures_dir / "multirun" / subdir

    store = ResultStore(results_dir, name, cfg, result_keys=getattr(module, "RESULT_KEYS", None))
    frame = module.run(cfg, store)
    figures = list(module.plot(frame, cfg, figures_dir))
    return RunOutputs(
        results_csv=store.csv_path,
        config_json=store.run_path,
        figures=figures,
        n_rows=len(frame),
    )


@hydra.main(config_path="configs", config_name="config", version_base=None)
def main(cfg: DictConfig) -> None:
    outputs = run_experiment(cfg)
    print(f"[{cfg.experiment.name}] {outputs.n_rows} rows -> {outputs.results_csv}")
    print(f"[{cfg.experiment.name}] resolved config -> {outputs.config_json}")
    for path in outputs.figures:
        print(f"[{cfg.experiment.name}] figure -> {path}")


if __name__ == "__main__":
    main()
