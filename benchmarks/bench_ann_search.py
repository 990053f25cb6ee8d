"""CPU search speed, one run: TurboQuant's fast-scan path against faiss IndexPQ, IndexPQFastScan, IndexRaBitQ and an
fp32 brute-force scan, one query at a time and a batch, at equal bits per coordinate (issue 17).

    python -m benchmarks.bench_ann_search --out results/ann_search      # 2 cores: about 35 minutes (measured, load 2-3)

For each ``d:bits`` of ``--configs`` (default 200:4 1536:4 1536:2 3072:4), ``--n`` random unit vectors and
``--queries`` random unit queries (seeded by d); a config ``NAME:bits`` instead reads the dataset config
``configs/dataset/NAME.yaml`` (e.g. ``glove50``, ``dbpedia_minilm``, ``dbpedia_minilm_lift1536``: real embeddings,
``experiments.ann_recall.load_ann_dataset``), ``--real-n`` base rows and ``--queries`` disjoint queries,
unit-normalized as in ``ann_recall``. Indexes (``turboquant.ann.make_index``): TurboQuant_mse and
TurboQuant_prod (randomized Hadamard rotation, ``scorer="fastscan"``; TurboQuant_mse also with its fast-scan rows
in one faiss index instead of one per thread, ``turboquant_mse_1shard``), ``pq_fastscan`` (M = d·bits/4 sub-quantizers
of 4 bits), ``pq`` (8-bit sub-quantizers), ``rabitq`` (``nb_bits = bits``, float queries) and ``exact``
(IndexFlatIP). The faiss indexes are trained on the first ``--train`` base vectors (their search cost does not
depend on the centroids; their recall is that of a ``--train``-sample codebook).

Timing (``time.perf_counter``, after one warm-up query): the fast indexes (TurboQuant, PQ fast-scan) are timed in
``--rounds`` interleaved rounds, the fastest round kept, so load spikes of a shared machine hit them alike; the
slow ones (pq, rabitq, exact) in one round. A round times ``--single`` queries one at a time and all queries in one
``search`` call; IndexRaBitQ, seconds per query at 100k × 1536 here, is timed on ``--slow-queries`` queries in one
call and ``--slow-single`` one at a time (stated in its rows). Recall@1@1 and recall@1@k (k = ``--k``) against
the exact top-1, on the batch's queries.

Writes ``<out>/ann_search.json`` (rows, saved after every config: a rerun skips configs already there, so a
killed run resumes), ``<out>/ann_search.md`` (the table, where one profiled TurboQuant batch spends its
time, and the TurboQuant / PQ fast-scan ratios) and
``<out>/ann_qps_recall.png``/``.pdf`` (queries/s against recall@1@k per config: the ANN benchmarks' plot).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

__all__ = ["bench_config", "main", "markdown", "plot"]

_TQ = {"rotation": "hadamard", "scorer": "fastscan"}
#: row label -> (turboquant.ann method, constructor options); "1 shard": the fast-scan rows in one faiss index
FAST = {"turboquant_mse": ("turboquant_mse", _TQ),
        "turboquant_mse_1shard": ("turboquant_mse", {**_TQ, "fastscan_shards": 1}),
        "turboquant_prod": ("turboquant_prod", _TQ), "pq_fastscan": ("pq_fastscan", {})}
SLOW = {"pq": ("pq", {}), "rabitq": ("rabitq", {}), "exact": ("exact", {})}


def _unit(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    x = rng.standard_normal((n, dim), dtype=np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _build(
    method: str, options: dict[str, Any], dim: int, bits: int, base: np.ndarray, train: int
) -> tuple[Any, float]:
    """The index filled with ``base`` and its build seconds (train on the first ``train`` rows + add)."""
    from turboquant.ann import make_index

    index = make_index(method, dim, None if method == "exact" else bits, **options)
    start = time.perf_counter()
    if index.requires_training:
        index.train(base[:train])
    index.add(base)
    return index, time.perf_counter() - start


def _timed_pass(index: Any, queries: np.ndarray, single: int, k: int) -> tuple[float, float, np.ndarray]:
    """Seconds per query one at a time (mean over ``single``), seconds of the batch, the batch's ids."""
    start = time.perf_counter()
    for i in range(single):
        index.search(queries[i : i + 1], k)
    one = (time.perf_counter() - start) / single
    start = time.perf_counter()
    _, ids = index.search(queries, k)
    return one, time.perf_counter() - start, ids


#: where a TurboQuant batch search spends its time (cProfile cumulative seconds of these functions)
PHASES = {"transform": "_transform", "scan": "search", "rerank": "_candidate_scores"}


def _phases(index: Any, queries: np.ndarray, k: int) -> dict[str, float]:
    """Seconds of one profiled batch search of a fast-scan TurboQuant index in its query transform, the faiss
    scan (``FastScanCodes.search``, all shards) and the exact re-rank, and in all (``batch_profiled_s``)."""
    import cProfile
    import pstats

    profile = cProfile.Profile()
    profile.enable()
    start = time.perf_counter()
    index.search(queries, k)
    total = time.perf_counter() - start
    profile.disable()
    stats = pstats.Stats(profile).stats  # (file, line, function) -> (calls, _, own s, cumulative s, callers)
    out = {"batch_profiled_s": total}
    for phase, function in PHASES.items():
        wanted = "fastscan.py" if phase == "scan" else "turboquant_index.py"
        out[f"batch_{phase}_s"] = sum(v[3] for (file, _, name), v in stats.items()
                                      if name == function and file.endswith(wanted))
    return out


@dataclass(frozen=True)
class SearchConfig:
    """One ``--configs`` entry: ``d:bits`` (random unit vectors of dimension d, seeded by d) or ``NAME:bits``
    (the dataset config ``configs/dataset/NAME.yaml``, unit-normalized)."""

    name: str
    bits: int

    @classmethod
    def parse(cls, text: str) -> SearchConfig:
        name, sep, bits = text.rpartition(":")
        if not sep or not name or not bits.isdigit():
            raise SystemExit(f"config {text!r}: expected d:bits or NAME:bits (e.g. 1536:4, glove50:4)")
        return cls(name, int(bits))

    def __str__(self) -> str:
        return f"{self.name}:{self.bits}"

    @property
    def random_dim(self) -> int | None:
        """d of a random config, None for a dataset config."""
        return int(self.name) if self.name.isdigit() else None

    @property
    def data(self) -> str:
        """The rows' data label: ``random`` or the dataset config's name."""
        return "random" if self.random_dim is not None else self.name


def load_config(config: SearchConfig, args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray]:
    """(base, queries) of ``config``: ``--n`` random base vectors, or ``--real-n`` of the dataset."""
    if config.random_dim is not None:
        rng = np.random.default_rng(config.random_dim)
        return _unit(rng, args.n, config.random_dim), _unit(rng, args.queries, config.random_dim)
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from experiments.ann_recall import load_ann_dataset

    configs = Path(__file__).resolve().parents[1] / "configs"
    if not (configs / "dataset" / f"{config.name}.yaml").exists():
        raise SystemExit(f"config {config}: no dataset config configs/dataset/{config.name}.yaml "
                         "(a config is d:bits or NAME:bits)")
    with initialize_config_dir(config_dir=str(configs), version_base=None):  # the group as run.py composes it
        dataset = compose("config", overrides=["experiment=distortion", f"dataset={config.name}"]).dataset
    data = load_ann_dataset(config.name, OmegaConf.to_container(dataset, resolve=True), args.real_n, args.queries,
                            seed=0, normalize=True)
    return data.base, data.queries


def bench_config(data: str, bits: int, base: np.ndarray, queries: np.ndarray,
                 args: argparse.Namespace) -> list[dict[str, Any]]:
    """Rows of one (data, d, bits): build seconds, one-query ms, batch queries/s and recall per index."""
    from turboquant.ann import recall_at_1_at_k

    dim = base.shape[1]
    truth = np.argmax(queries @ base.T, axis=1)
    indexes, rows = {}, {}
    for method, (name, options) in {**FAST, **SLOW}.items():
        index, build_s = _build(name, options, dim, bits, base, args.train)
        index.search(queries[:1], args.k)  # warm-up
        indexes[method] = index
        timed = min(args.slow_queries, args.queries) if method == "rabitq" else args.queries
        single = min(args.slow_single, timed) if method == "rabitq" else args.single
        rows[method] = {"data": data, "dim": dim, "bits": bits, "method": method, "n_base": len(base),
                        "build_s": build_s,
                        "batch": timed, "single_queries": single, "one_query_ms": np.inf,
                        "batch_s": np.inf, "rounds": 0}
        print(f"{data} d={dim} bits={bits} {method}: built in {build_s:.2f} s", flush=True)
    for round_ in range(args.rounds):
        for method, index in indexes.items():
            if method in SLOW and round_:
                continue
            row = rows[method]
            one, batch_s, ids = _timed_pass(index, queries[: row["batch"]], row["single_queries"], args.k)
            recall = recall_at_1_at_k(truth[: row["batch"]], ids, [1, args.k])
            row.update(one_query_ms=min(row["one_query_ms"], 1e3 * one), batch_s=min(row["batch_s"], batch_s),
                       rounds=row["rounds"] + 1, recall_at_1=recall[1], recall_at_k=recall[args.k], k=args.k,
                       load_average=os.getloadavg()[0])
    for method, row in rows.items():
        row["batch_queries_per_s"] = row["batch"] / row["batch_s"]
        if method.startswith("turboquant"):
            row.update(_phases(indexes[method], queries, args.k))
    return list(rows.values())


def _data_words(df: pd.DataFrame) -> str:
    """What the rows searched, for titles: random unit vectors are said to be synthetic."""
    names = [name for name in dict.fromkeys(df["data"]) if name != "random"]
    words = ["random unit vectors (synthetic data, not embeddings)"] if "random" in set(df["data"]) else []
    return " and ".join(words + ([f"real embeddings ({', '.join(names)})"] if names else []))


def markdown(df: pd.DataFrame, header: dict[str, Any]) -> str:
    """The rows as a table, then TurboQuant / PQ fast-scan ratios per config (same run)."""
    lines = [f"# CPU search on {_data_words(df)} ({header['cpu']}, {header['threads']} threads, "
             f"faiss {header['faiss']}); command: `{header['command']}`", "",
             "| data | n | d | bits | index | build s | one query ms | batch | batch q/s | R@1@1 | R@1@k | rounds "
             "| load |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for _, r in df.iterrows():
        lines.append(f"| {r.data} | {r.n_base} | {r.dim} | {r.bits} | {r.method} | {r.build_s:.3g} | "
                     f"{r.one_query_ms:.3g} | {r.batch} | "
                     f"{r.batch_queries_per_s:.4g} | {r.recall_at_1:.3f} | {r.recall_at_k:.3f} | {r.rounds} | "
                     f"{r.load_average:.2f} |")
    lines += ["", "TurboQuant batch, one profiled search (cProfile): seconds in the query transform, the faiss scan "
              "(all shards) and the exact re-rank, beside IndexPQFastScan's fastest batch:", "",
              "| data | d | bits | index | profiled s | transform s | scan s | re-rank s | PQFastScan batch s |",
              "|---|---|---|---|---|---|---|---|---|"]
    for _, r in df[df["method"].str.startswith("turboquant")].iterrows():
        pq = df[(df["data"] == r.data) & (df["dim"] == r.dim) & (df["bits"] == r.bits)
                & (df["method"] == "pq_fastscan")]["batch_s"]
        lines.append(f"| {r.data} | {r.dim} | {r.bits} | {r.method} | {r.batch_profiled_s:.3g} | "
                     f"{r.batch_transform_s:.3g} | "
                     f"{r.batch_scan_s:.3g} | {r.batch_rerank_s:.3g} | {pq.iloc[0] if len(pq) else float('nan'):.3g} |")
    lines += ["", "TurboQuant / IndexPQFastScan (> 1: TurboQuant faster), same run:", ""]
    for (data, dim, bits), part in df.groupby(["data", "dim", "bits"], sort=False):
        by = part.set_index("method")
        for method in ("turboquant_mse", "turboquant_mse_1shard", "turboquant_prod"):
            if method in by.index and "pq_fastscan" in by.index:
                tq, pq = by.loc[method], by.loc["pq_fastscan"]
                lines.append(f"- {data}, d={dim}, {bits} bits, {method}: one query "
                             f"{pq.one_query_ms / tq.one_query_ms:.2f}x, "
                             f"batch of {int(tq.batch)} {tq.batch_queries_per_s / pq.batch_queries_per_s:.2f}x")
    return "\n".join(lines) + "\n"


def plot(df: pd.DataFrame, out: Path) -> list[Path]:
    """Queries/s (log) against recall@1@k, one panel per (d, bits): filled = batch, open = one query at a time."""
    import matplotlib.pyplot as plt

    from experiments.plotting import figure_style, save_figure

    configs = list(df.groupby(["data", "dim", "bits"], sort=False).groups)
    methods = list(dict.fromkeys(df["method"]))
    colors = dict(zip(methods, plt.get_cmap("tab10").colors))
    with figure_style():
        fig, axes = plt.subplots(1, len(configs), figsize=(3.6 * len(configs) + 2.4, 3.6), squeeze=False)
        for ax, (data, dim, bits) in zip(axes[0], configs):
            part = df[(df["data"] == data) & (df["dim"] == dim) & (df["bits"] == bits)]
            for _, r in part.iterrows():
                ax.scatter(r.recall_at_k, r.batch_queries_per_s, marker="o", color=colors[r.method])
                ax.scatter(r.recall_at_k, 1e3 / r.one_query_ms, marker="^", facecolors="none", color=colors[r.method])
            ax.set_yscale("log")
            ax.set_xlabel(f"recall@1@{int(part['k'].iloc[0])}")
            ax.set_ylabel("queries / s")
            ax.set_title(f"{data}, d={dim}, {bits} bits, n={int(part['n_base'].iloc[0])}", fontsize=8)
        handles = [plt.Line2D([], [], ls="", marker="s", color=colors[m], label=m) for m in methods]
        handles += [plt.Line2D([], [], ls="", marker="o", color="k", label="batch"),
                    plt.Line2D([], [], ls="", marker="^", color="k", markerfacecolor="none", label="one query")]
        axes[0][-1].legend(handles=handles, fontsize=6, loc="center left", bbox_to_anchor=(1.02, 0.5))
        fig.suptitle(f"CPU search throughput vs recall on {_data_words(df)}, one run (benchmarks/bench_ann_search.py)",
                     fontsize=8)
        fig.tight_layout()
        return save_figure(fig, out, "ann_qps_recall")


def _cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux), else what ``platform`` reports."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configs", nargs="+", default=["200:4", "1536:4", "1536:2", "3072:4"],
                        help="d:bits (random unit vectors) or NAME:bits (configs/dataset/NAME.yaml)")
    parser.add_argument("--n", type=int, default=100_000, help="random base vectors")
    parser.add_argument("--real-n", type=int, default=20_000, help="base vectors of a dataset config")
    parser.add_argument("--queries", type=int, default=200, help="the batch")
    parser.add_argument("--single", type=int, default=10, help="queries timed one at a time")
    parser.add_argument("--slow-queries", type=int, default=5, help="IndexRaBitQ's batch")
    parser.add_argument("--slow-single", type=int, default=2, help="IndexRaBitQ's queries one at a time")
    parser.add_argument("--train", type=int, default=10_000, help="faiss training sample")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the fast indexes")
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("results/ann_search"))
    args = parser.parse_args(argv)
    import faiss

    from experiments.ann_recall import set_threads

    set_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "ann_search.json"
    header = {"cpu": _cpu_name(), "cores": os.cpu_count(),
              "threads": args.threads, "faiss": faiss.__version__,
              "command": "python -m benchmarks.bench_ann_search " + " ".join(sys.argv[1:] if argv is None else argv)}
    saved = json.loads(path.read_text()) if path.exists() else {"header": header, "rows": []}
    for row in saved["rows"]:  # rows written before real data were random
        row.setdefault("data", "random")
    for config in map(SearchConfig.parse, args.configs):
        n = args.n if config.random_dim is not None else args.real_n
        done = [r for r in saved["rows"] if r["data"] == config.data and r["bits"] == config.bits and r["n_base"] == n
                and (config.random_dim is None or r["dim"] == config.random_dim)]
        if done:
            print(f"{config}: in {path}, skipped", flush=True)
            continue
        base, queries = load_config(config, args)
        saved["rows"] += bench_config(config.data, config.bits, base, queries, args)
        path.write_text(json.dumps(saved, indent=1))
    df = pd.DataFrame(saved["rows"])
    (args.out / "ann_search.md").write_text(markdown(df, saved["header"]))
    plot(df, args.out)
    print((args.out / "ann_search.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
