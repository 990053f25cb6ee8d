"""The spread of ann_recall's TurboQuant recall over seeds: recall@1@k per (data set, method, bits) for every seed
found, with mean, standard deviation and standard error of the mean (issue 13: Fig. 5's rows with error bars).

    for s in 1 2 3 4; do python run.py experiment=ann_recall 'experiment.methods=[turboquant_mse,turboquant_prod]' \\
        seed=$s paths.results_dir=<dir> paths.figures_dir=<dir>/figures; done
    python scripts/ann_recall_seed_spread.py results/ann_recall/results.csv <dir>/ann_recall/results.csv \\
        --out results/ann_recall/seed_spread

``seed`` draws both the data split (which rows are base and queries) and the rotation / QJL matrices, so the spread
is that of a whole rerun, the error a reader of one run's recall should allow. Rows of other methods and scales are
ignored; each (data set, method, bits, k, seed) must occur once across the inputs (a repeat is an error, not
averaged).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

KEYS = ["dataset_name", "method", "bits", "k"]


def spread(frames: list[pd.DataFrame], scale: str, ks: list[int]) -> pd.DataFrame:
    """One row per (data set, method, bits, k): the recall of each seed, their mean, SD and SE."""
    rows = pd.concat(frames, ignore_index=True)
    rows = rows[(rows["scale"] == scale) & rows["method"].str.startswith("turboquant") & rows["k"].isin(ks)]
    repeated = rows.duplicated(KEYS + ["seed"], keep=False)
    if repeated.any():
        raise SystemExit(f"{int(repeated.sum())} rows repeat a (data set, method, bits, k, seed): "
                         f"{rows[repeated][KEYS + ['seed']].head().to_dict('records')}")
    table = rows.pivot_table(index=KEYS, columns="seed", values="recall", aggfunc="first")
    table.columns = [f"seed {int(c)}" for c in table.columns]
    values = table.to_numpy(dtype=float)
    n = np.sum(~np.isnan(values), axis=1)
    table["seeds"] = n
    table["mean"] = np.nanmean(values, axis=1)
    table["sd"] = np.nanstd(values, axis=1, ddof=1)
    table["se"] = table["sd"] / np.sqrt(n)
    return table.reset_index()


def markdown(table: pd.DataFrame, command: str) -> str:
    seeds = [c for c in table.columns if c.startswith("seed ")]
    lines = ["# ann_recall: TurboQuant recall@1@k over seeds (data split and quantizer)", "",
             f"Made by `{command}`. SD over seeds (ddof 1), SE = SD / sqrt(seeds).", "",
             "| data | method | bits | k | " + " | ".join(seeds) + " | mean | SD | SE |",
             "|---|---|---|---|" + "---|" * (len(seeds) + 3)]
    for _, r in table.iterrows():
        cells = " | ".join("" if np.isnan(r[c]) else f"{r[c]:.3f}" for c in seeds)
        lines.append(f"| {r.dataset_name} | {r.method} | {r.bits} | {r.k} | {cells} | {r['mean']:.4f} | "
                     f"{r.sd:.4f} | {r.se:.4f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("results", nargs="+", type=Path, help="ann_recall results.csv files")
    parser.add_argument("--scale", default="quick")
    parser.add_argument("--k", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    for path in args.results:
        if not path.exists():
            raise SystemExit(f"{path}: no such results file")
    table = spread([pd.read_csv(path) for path in args.results], args.scale, args.k)
    if table.empty:
        raise SystemExit(f"no TurboQuant rows at scale {args.scale!r} and k in {args.k} in {args.results}")
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "seed_spread.csv", index=False)
    command = "python scripts/ann_recall_seed_spread.py " + " ".join(argv if argv is not None else sys.argv[1:])
    (args.out / "seed_spread.md").write_text(markdown(table, command))
    print((args.out / "seed_spread.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
