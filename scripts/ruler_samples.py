"""Generate the RULER sample sets a run will read, on this machine, computing nothing else.

    TURBOQUANT_CACHE_DIR=<cache> python scripts/ruler_samples.py experiment=ruler model=qwen25_coder_15b scale=gpu \\
        scale.device=cpu experiment.sizes.gpu.samples=10 'experiment.sizes.gpu.method_seeds=[0]'

takes ``run.py``'s overrides (``only=[...]``, ``shard=i/n`` included), reads the store read-only to find the units
the run would compute, loads the model as the run does (its tokenizer is part of every sample set's cache key:
``scale.device=cpu`` loads it here), and writes the sample sets of those units' (task, context) pairs into
``<cache>/ruler_samples/<model>``. Carried to the GPU machine as that folder, they spare its time the generators
(``scripts/h200_llm.sh`` reads ``/tmp/tqcache/ruler_samples``); a set whose key differs there is generated there.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from hydra import compose, initialize_config_dir  # noqa: E402

import run  # noqa: E402
from experiments.data.cache import cache_root  # noqa: E402
from experiments.io import ResultStore  # noqa: E402
from experiments.models import load_model, model_spec_from_config  # noqa: E402
from experiments.ruler import experiment as ruler  # noqa: E402


def main(overrides: list[str]) -> int:
    with initialize_config_dir(str(REPO_ROOT / "configs"), version_base=None):
        cfg = compose("config", overrides=overrides)
    if cfg.experiment.name != "ruler":
        raise SystemExit(f"experiment={cfg.experiment.name}: this script makes RULER sample sets (experiment=ruler)")
    run.select_methods(cfg)
    shard = run.take_shard(cfg)
    store = ResultStore(run.resolve_path(cfg.paths.results_dir), "ruler", cfg, result_keys=ruler.RESULT_KEYS,
                        read_only=True, shard=shard)
    missing = ruler.missing_units(cfg, store)
    pairs = sorted({(unit["task"], unit["context"]) for unit in missing})
    print(f"{len(missing)} units to compute, {len(pairs)} (task, context) sample sets")
    if not missing:
        return 0
    start = time.perf_counter()
    loaded = load_model(model_spec_from_config(cfg.model), device=cfg.scale.device)
    sets, failed = ruler.sample_sets_for(cfg, missing, loaded.tokenizer)
    for (task, context), samples in sorted(sets.items()):
        print(f"  {task} at {context}: {len(samples)} samples")
    for (task, context), why in sorted(failed.items()):
        print(f"  {task} at {context}: FAILED ({why})")
    print(f"{len(sets)} sets in {cache_root() / 'ruler_samples' / cfg.model.name} "
          f"({time.perf_counter() - start:.0f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
