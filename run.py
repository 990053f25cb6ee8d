"""Hydra entry point: config → ``experiments.<name>.run`` → results/ CSV → ``plot`` → figures/.

    python run.py experiment=distortion                       # quick scale, default dataset
    python run.py experiment=needle scale=smoke only=[full,kivi]
    python run.py experiment=longbench scale=gpu shard=0/2          # half the missing units (shard=1/2: the rest)
    python run.py -m hydra/launcher=joblib experiment=distortion quantizer.rotation=haar,hadamard
    python run.py --help                                      # the experiments and the config groups

Each experiment module provides ``run(cfg, store) -> pandas.DataFrame`` and
``plot(df, cfg, figures_dir) -> list[Path]``; optionally ``RESULT_KEYS`` (the dotted config paths
that determine its numbers, see :mod:`experiments.io`) and ``paper_comparison(df)`` (see
``scripts/compare_to_paper.py``). This file only wires them together, and applies the root config's
``only`` (a subset of ``experiment.methods``) and ``shard`` (a part of the units, :class:`experiments.io.Shard`)
before the experiment sees its config.
"""

from __future__ import annotations

import importlib
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import hydra
from omegaconf import DictConfig, ListConfig, open_dict

from experiments.io import ResultStore, Shard

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


def select_methods(cfg: DictConfig) -> None:
    """Keep only the methods named in ``cfg.only`` (in the experiment's order) and drop the ``only`` key.

    ``experiment.methods`` is a list of names (distortion, ANN) or a mapping of method configs (needle,
    LongBench); either way ``only=[a,b]`` keeps those entries. The key is removed so that it never enters a
    result's identity: a subset's units are the full run's units, and a later full run reuses them.
    """
    only = cfg.get("only")
    with open_dict(cfg):
        cfg.pop("only", None)
    if only is None:
        return
    if isinstance(only, str):
        only = [only]
    methods = cfg.experiment.get("methods")
    if methods is None:
        raise ValueError(f"only={list(only)}: experiment {cfg.experiment.name!r} has no experiment.methods to select from")
    available = list(methods) if isinstance(methods, ListConfig) else list(methods.keys())
    unknown = [name for name in only if name not in available]
    if unknown or not only:
        raise ValueError(f"only={list(only)}: experiment {cfg.experiment.name!r} has methods {available}")
    with open_dict(cfg):
        if isinstance(methods, ListConfig):
            cfg.experiment.methods = [name for name in methods if name in only]
        else:
            for name in available:
                if name not in only:
                    del cfg.experiment.methods[name]


def take_shard(cfg: DictConfig) -> Shard | None:
    """The root config's ``shard`` (``"i/n"``: compute only part i of n of the missing units, so n processes of one
    command share its work) as a :class:`Shard`, or None; the key is dropped, so the shard never enters a result's
    identity and the shards' rows are the unsplit run's."""
    text = cfg.get("shard")
    with open_dict(cfg):
        cfg.pop("shard", None)
    return None if text is None else Shard.parse(text)


def _multirun_figures_dir() -> Path | None:
    """In a Hydra multirun whose jobs differ in more than experiment/dataset/scale/paths (see
    ``hydra.job.config.override_dirname.exclude_keys`` in config.yaml), e.g. ``quantizer.rotation=haar,hadamard``,
    the job's own output folder (``multirun/<experiment>/<time>/<job number>/figures``, beside the job's
    ``.hydra/overrides.yaml``; git-ignored), so that jobs never overwrite each other's figures; None (figures
    straight into figures_dir) outside a multirun or when nothing else is overridden, as in
    ``-m experiment=distortion,ip_histogram,ip_variance``."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return None
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode != RunMode.MULTIRUN or not hydra_cfg.job.override_dirname:
        return None
    return Path(hydra_cfg.runtime.output_dir) / "figures"


class Interrupted(Exception):
    """A run stopped by Ctrl-C; ``units`` of this config were stored by it (they are kept)."""

    def __init__(self, experiment: str, units: int) -> None:
        super().__init__(f"[{experiment}] stopped after {units} unit{'s' * (units != 1)}; "
                         "rerun the same command to resume (finished units are kept)")
        self.units = units


def _stored_units(store: ResultStore) -> int:
    """Units of this config in the store, counted with Ctrl-C ignored (a second Ctrl-C must not cut the count;
    only the main thread may set a signal handler, so a threaded launcher's job counts without)."""
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if in_main_thread else None
    try:
        return int(store.frame()["unit_id"].nunique())
    finally:
        if in_main_thread:
            signal.signal(signal.SIGINT, previous)


def run_experiment(cfg: DictConfig, root: Path = REPO_ROOT) -> RunOutputs:
    """Run the configured experiment, store its rows, draw its figures.

    Raises :class:`Interrupted` on Ctrl-C (KeyboardInterrupt), counting the units this run stored.
    """
    select_methods(cfg)
    shard = take_shard(cfg)
    name = cfg.experiment.name
    module = load_experiment(name)
    results_dir = resolve_path(cfg.paths.results_dir, root)
    figures_dir = _multirun_figures_dir() or resolve_path(cfg.paths.figures_dir, root)

    store = ResultStore(results_dir, name, cfg, result_keys=getattr(module, "RESULT_KEYS", None), shard=shard)
    stored_before = _stored_units(store)
    try:
        frame = module.run(cfg, store)
        figures = list(module.plot(frame, cfg, figures_dir))
    except KeyboardInterrupt:
        raise Interrupted(name, _stored_units(store) - stored_before) from None
    return RunOutputs(
        results_csv=store.csv_path,
        config_json=store.run_path,
        figures=figures,
        n_rows=len(frame),
    )


@hydra.main(config_path="configs", config_name="config", version_base=None)
def main(cfg: DictConfig) -> None:
    try:
        outputs = run_experiment(cfg)
    except Interrupted as stopped:
        print(f"\n{stopped}", file=sys.stderr)
        sys.exit(130)  # the shell's code for SIGINT
    print(f"[{cfg.experiment.name}] {outputs.n_rows} rows -> {outputs.results_csv}")
    print(f"[{cfg.experiment.name}] resolved config -> {outputs.config_json}")
    for path in outputs.figures:
        print(f"[{cfg.experiment.name}] figure -> {path}")


if __name__ == "__main__":
    main()
