"""Behaviour unchanged? Run every embedding experiment at a tiny fixed-seed scale at two commits, diff the CSVs.

    python scripts/check_identical_results.py                  # base = merge base of HEAD and main
    python scripts/check_identical_results.py --base <commit> --experiments distortion ann_recall
    python scripts/check_identical_results.py --experiments kernels      # the kernel benchmark's checks (CPU)
    python scripts/check_identical_results.py --experiments needle longbench kv_ablation ruler   # the LLM experiments

The LLM experiments (:data:`LLM_EXPERIMENTS`) run at ``scale=smoke`` on the CPU with a tiny random Llama (6 layers,
head_dim 64, a byte-level BPE tokenizer) written once by the head commit's ``tests.experiments.llm_fixtures`` and
loaded by both commits as a local model, 4 new tokens per answer.

Each commit is checked out with ``git worktree add --detach`` into a temporary directory, and every experiment
runs there through that commit's own ``run.run_experiment`` on tiny random-sphere data (seed 0, the sizes in
:data:`RUNS`), writing into a results directory of its own. The two ``results.csv`` of each experiment are then
compared cell for cell as text, after dropping the columns that hold timings or thread counts
(:data:`TIMING`; for ``kernels`` also the floor, the ratios computed from times and the command line). Prints,
per experiment, ``identical`` or every column whose values differ with the first differing pair; exits 1 if any
experiment differs. Needs no network: random-sphere data only.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SPHERE = {"name": "random_sphere", "loader": "random_sphere", "label": "uniform random unit vectors (32-d)",
          "substitution": None, "dim": 32, "lift_dim": None, "n_base": 600, "n_queries": 40}
_SMALL = ["dataset=random_sphere", "dataset.dim=64", "experiment.sizes.quick.n_base=1500",
          "experiment.sizes.quick.n_queries=40", "experiment.pair_chunk=7000"]
# experiment -> (Hydra overrides, config keys replaced after composition)
RUNS: dict[str, tuple[list[str], dict]] = {
    "distortion": (_SMALL + ["experiment.bits=[1,2,3]"], {}),
    "ip_histogram": (_SMALL + ["experiment.bits=[1,2]", "experiment.n_bins=41"], {}),
    "ip_variance": (["dataset=random_sphere", "dataset.dim=64", "experiment.sizes.quick.n_base=1500",
                     "experiment.sizes.quick.n_queries=40", "experiment.n_bins=31",
                     "experiment.quantile_sample_pairs=20000"], {}),
    "ann_recall": (["experiment.methods=[turboquant_mse,turboquant_prod,pq,rabitq]", "experiment.k_max=8"],
                   {"experiment.datasets": {"sphere": SPHERE},
                    "experiment.sizes.quick": {"sphere": {"n_base": 600, "n_queries": 40}}}),
    "ann_indexing_time": (["experiment.methods=[turboquant_mse,pq,rabitq]", "experiment.repeats=2",
                           "experiment.single_queries=3"],
                          {"experiment.datasets": {"random_sphere": SPHERE},
                           "experiment.sizes.quick": {"n_base": 500, "n_queries": 20,
                                                      "data": ["random_sphere:16", "random_sphere:24"]}}),
    "quantizer_disputes": (["dataset=random_sphere", "dataset.dim=64", "experiment.sizes.quick.n_base=400",
                            "experiment.sizes.quick.n_queries=30", "experiment.bits=[1,2]", "experiment.seeds=[0,1]"],
                           {}),
    # not an embedding experiment and not in the default list: the kernel benchmark's checks (errors against
    # the float64 references) under the CPU interpreter, decode_step left out (minutes there)
    "kernels": (["experiment.smoke=true", "experiment.ops=[quantize,library,prod,scores,decode]"], {}),
    # the LLM experiments at scale=smoke with the tiny model (TINY_LLAMA is replaced by its folder)
    "needle": (["scale=smoke", "experiment.generation.max_new_tokens=4"], {"model": "TINY_LLAMA"}),
    "kv_ablation": (["scale=smoke", "experiment.generation.max_new_tokens=4"], {"model": "TINY_LLAMA"}),
    "longbench": (["scale=smoke"], {"model": "TINY_LLAMA"}),
    "ruler": (["scale=smoke", "experiment.sizes.smoke.tasks=[fwe]"], {"model": "TINY_LLAMA"}),  # a quick generator
}
EMBEDDING_EXPERIMENTS = ["distortion", "ip_histogram", "ip_variance", "ann_recall", "ann_indexing_time",
                         "quantizer_disputes"]
LLM_EXPERIMENTS = ["needle", "longbench", "kv_ablation", "ruler"]
_TINY_LLAMA = """
import sys
from pathlib import Path
from tests.experiments.llm_fixtures import save_tiny_llama
print(save_tiny_llama(Path(sys.argv[1]), head_dim=64, num_layers=6))
"""
# columns that measure the machine, not the method: times (``*_s``, ``*_us``, also ``build_s_min``), throughputs,
# thread counts, load, repetitions cut by a time budget (ann_indexing_time's ``repeats_done``); for kernels the
# ratios computed from times and the command line
TIMING = re.compile(r"_(s|ms|us)(_(min|max|median|mean|fastscan))?$|_per_s$|threads$|^load_average$|^repeats_done$"
                    r"|^(seconds|gbps|fraction_of_floor|speedup_vs_baseline|copy_bandwidth_gbps|command)$")

# runs inside a checked-out tree (cwd = tree, sys.path[0] = tree): compose, replace keys, run, print the csv path
_DRIVER = """
import json, sys
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf, open_dict
import run
experiment, overrides, replace, results = json.loads(sys.argv[1])
if not any(o.startswith("scale=") for o in overrides):
    overrides = ["scale=quick", *overrides]
with initialize_config_dir(config_dir=str(run.REPO_ROOT / "configs"), version_base=None):
    cfg = compose("config", overrides=[f"experiment={experiment}", "seed=0",
                                       f"paths.results_dir={results}", f"paths.figures_dir={results}/figures",
                                       *overrides])
with open_dict(cfg):
    for key, value in replace.items():
        OmegaConf.update(cfg, key, OmegaConf.create(value), merge=False)
print(run.run_experiment(cfg).results_csv)
"""


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], check=True, capture_output=True, text=True).stdout.strip()


def tiny_model_config(folder: Path) -> dict:
    """The ``model`` config of the tiny random Llama saved in ``folder``."""
    return {"name": "tiny", "display_name": "tiny random Llama", "dtype": "float32", "pretrained": str(folder)}


def save_tiny_llama(tree: Path, folder: Path) -> Path:
    """Write the tiny random Llama with ``tree``'s test fixture into ``folder``."""
    done = subprocess.run([sys.executable, "-c", _TINY_LLAMA, str(folder)], cwd=tree, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(tree)})
    if done.returncode:
        raise RuntimeError(f"the tiny Llama could not be written:\n{done.stderr[-3000:]}")
    return folder


def run_at(tree: Path, experiment: str, results: Path, tiny_llama: Path | None = None) -> Path:
    """``results.csv`` of ``experiment`` run in the checked-out ``tree``; RuntimeError with its stderr if it fails."""
    overrides, replace = RUNS[experiment]
    if replace.get("model") == "TINY_LLAMA":
        replace = {**replace, "model": tiny_model_config(tiny_llama)}
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg",
           **({"TRITON_INTERPRET": "1"} if experiment == "kernels" else {})}
    done = subprocess.run([sys.executable, "-c", _DRIVER, json.dumps([experiment, overrides, replace, str(results)])],
                          cwd=tree, env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{experiment} failed in {tree}:\n{done.stderr[-3000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


def read_rows(path: Path) -> tuple[list[str], list[list[str]]]:
    with path.open(newline="") as handle:
        rows = list(csv.reader(handle))
    if not rows:
        raise ValueError(f"{path}: empty results file")
    return rows[0], rows[1:]


def compare(base_csv: Path, head_csv: Path) -> list[str]:
    """Differences between the two CSVs outside the timing columns, one line each (empty: identical)."""
    base_cols, base_rows = read_rows(base_csv)
    head_cols, head_rows = read_rows(head_csv)
    problems = []
    if base_cols != head_cols:
        problems.append(f"columns differ: only in base {sorted(set(base_cols) - set(head_cols))}, "
                        f"only in head {sorted(set(head_cols) - set(base_cols))}")
    if len(base_rows) != len(head_rows):
        problems.append(f"{len(base_rows)} rows at base, {len(head_rows)} at head")
    kept = [c for c in base_cols if c in head_cols and not TIMING.search(c)]
    for column in kept:
        i, j = base_cols.index(column), head_cols.index(column)
        pairs = [(a[i], b[j]) for a, b in zip(base_rows, head_rows) if a[i] != b[j]]
        if pairs:
            problems.append(f"column {column!r}: {len(pairs)} of {len(base_rows)} values differ, "
                            f"first {pairs[0][0]!r} -> {pairs[0][1]!r}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", default=None, help="commit to compare with (default: merge base of HEAD, main)")
    parser.add_argument("--head", default="HEAD")
    parser.add_argument("--experiments", nargs="+", default=EMBEDDING_EXPERIMENTS, choices=list(RUNS))
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a killed check still removes its worktrees
    commits = {"base": git("rev-parse", args.base or git("merge-base", "HEAD", "main")),
               "head": git("rev-parse", args.head)}
    print(f"base {commits['base'][:12]}  head {commits['head'][:12]}  (timing columns ignored: {TIMING.pattern})")
    differing = 0
    with tempfile.TemporaryDirectory(prefix="identical-results-") as tmp:
        trees = {side: Path(tmp) / side for side in commits}
        try:
            for side, commit in commits.items():
                git("worktree", "add", "--detach", str(trees[side]), commit)
            tiny_llama = None
            if set(args.experiments) & set(LLM_EXPERIMENTS):
                tiny_llama = save_tiny_llama(trees["head"], Path(tmp) / "tiny_llama")
            for experiment in args.experiments:
                csvs = [run_at(trees[side], experiment, Path(tmp) / f"results-{side}", tiny_llama) for side in commits]
                problems = compare(*csvs)
                kept = [c for c in read_rows(csvs[0])[0] if not TIMING.search(c)]
                ignored = [c for c in read_rows(csvs[0])[0] if TIMING.search(c)]
                print(f"{experiment}: {len(read_rows(csvs[0])[1])} rows, {len(kept)} columns compared"
                      f"{f' (ignored {ignored})' if ignored else ''}: "
                      f"{'identical' if not problems else 'DIFFERENT'}")
                for line in problems:
                    print(f"  {line}")
                differing += bool(problems)
        finally:
            for tree in trees.values():
                if tree.exists():
                    git("worktree", "remove", "--force", str(tree))
    return 1 if differing else 0


if __name__ == "__main__":
    raise SystemExit(main())
