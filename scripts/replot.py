"""Tables and figures of one experiment from its stored results, computing nothing.

    python scripts/replot.py experiment=kv_ablation model=qwen25_coder_15b scale=gpu

takes the same overrides as ``run.py`` (the config decides which stored rows are this run's, as in ``run.py``), reads
``<results_dir>/<experiment>/results.csv``, and calls the experiment's ``write_tables`` (if it has one) and ``plot``.
For results produced on another machine (the H200 runs of ``results/*_h200/``), whose figures were not drawn there.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from hydra import compose, initialize_config_dir  # noqa: E402

from experiments.io import ResultStore  # noqa: E402
from run import load_experiment, resolve_path  # noqa: E402


def main(overrides: list[str]) -> None:
    with initialize_config_dir(str(REPO_ROOT / "configs"), version_base=None):
        cfg = compose("config", overrides=overrides)
    module = load_experiment(cfg.experiment.name)
    store = ResultStore(resolve_path(cfg.paths.results_dir), cfg.experiment.name, cfg,
                        result_keys=getattr(module, "RESULT_KEYS", None), read_only=True)
    frame = module.stored_frame(cfg, store) if hasattr(module, "stored_frame") else store.frame()
    if frame.empty:
        raise SystemExit(f"no stored rows of this config (config_id {store.config_id}) in {store.csv_path}")
    if hasattr(module, "write_tables"):
        module.write_tables(frame, cfg, store.directory)
    for path in module.plot(frame, cfg, resolve_path(cfg.paths.figures_dir)):
        print(f"[{cfg.experiment.name}] {len(frame)} stored rows -> {path}")


if __name__ == "__main__":
    main(sys.argv[1:])
