"""Triton kernel benchmark (issue 4) as an experiment: config -> :mod:`benchmarks` -> result rows -> report, plot.

    python run.py experiment=kernels                           # one CUDA GPU (an H200: see benchmarks/NOTES.md)
    python run.py experiment=kernels scale=paper               # the issue's largest sizes too (128K context)
    python run.py experiment=kernels 'experiment.ops=[decode_step]'
    python run.py experiment=kernels +kernels_set=session5   # a named set of ops, sizes and variants (configs/kernels_set)
    TRITON_INTERPRET=1 python run.py experiment=kernels experiment.smoke=true   # CPU: checks the code path only

Each op of ``experiment.ops`` (``benchmarks.suite.OPS``: quantize, library, prod, scores, decode, decode_step) is
checked against its float64 reference, then timed against its byte floor and a PyTorch baseline of the same run
(``benchmarks/utils.py`` says how). Sizes and variants: ``configs/experiment/kernels.yaml``. Results:
``results/kernels/results.csv`` (one unit per op and GPU; a killed run resumes at the next op) and
``results/kernels/kernels.md`` (command, GPU, versions, copy bandwidth, the table).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from experiments.io import ResultStore, experiment_sizes

from benchmarks.utils import HEAD_DIM  # the shapes every kernel benchmark uses

__all__ = ["apply_variant_set", "paper_comparison", "plot", "require_kernel_device", "run"]


def require_kernel_device(cfg: Any) -> torch.device:
    """The CUDA device, or the CPU under ``TRITON_INTERPRET=1`` with ``experiment.smoke=true``; else ValueError."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    if cfg.experiment.smoke and os.environ.get("TRITON_INTERPRET") == "1":
        return torch.device("cpu")
    raise ValueError(
        "experiment=kernels times Triton GPU kernels and needs a CUDA device, but torch.cuda.is_available() is "
        "False here. Run it on a CUDA GPU, or check the code path on the CPU with tiny sizes (times meaningless): "
        "TRITON_INTERPRET=1 python run.py experiment=kernels experiment.smoke=true")


def apply_variant_set(cfg: Any) -> None:
    """With a ``kernels_set`` group chosen (``+kernels_set=<name>``, ``configs/kernels_set/``), replace
    ``experiment.ops``, ``sizes`` and ``variants`` by its blocks (whole, not merged)."""
    chosen = cfg.get("kernels_set")
    if not chosen:
        return
    from omegaconf import open_dict

    with open_dict(cfg.experiment):
        for key in ("ops", "sizes", "variants"):
            cfg.experiment[key] = chosen[key]


def _sizes(cfg: Any) -> Any:
    return cfg.experiment.sizes.smoke if cfg.experiment.smoke else experiment_sizes(cfg)


def run(cfg: Any, store: ResultStore) -> pd.DataFrame:
    """Check and time every op of ``experiment.ops``; one stored unit per (benchmark = op, GPU); writes
    ``kernels.md``."""
    import triton

    from benchmarks.suite import select_ops
    from benchmarks.utils import Bench, compiled_kernels, device_name, markdown_table

    device = require_kernel_device(cfg)
    apply_variant_set(cfg)
    ops = select_ops(cfg.experiment.ops)
    sizes = _sizes(cfg)
    torch.manual_seed(cfg.seed)
    gpu = device_name(device)
    bench = Bench.measure(device, int(sizes.copy_bytes))
    copy_gbps = round(bench.copy_bw / 1e9, 1)
    command = " ".join([Path(sys.executable).name, *sys.argv])
    header = (f"command: {command}\ndevice: {gpu}; torch {torch.__version__}; triton {triton.__version__}; "
              f"copy bandwidth {bench.copy_bw / 1e9:.0f} GB/s (read + write)")
    print(header, flush=True)
    store.record_provenance(command=command, gpu=gpu, torch=torch.__version__, triton=triton.__version__,
                            copy_bandwidth_gbps=copy_gbps)
    units = [{"benchmark": op, "gpu": gpu} for op in ops]

    def compute(unit: Mapping[str, Any], prepared: None) -> list[dict[str, Any]]:
        op = unit["benchmark"]
        started, compiled = time.perf_counter(), compiled_kernels()
        rows = ops[op](bench, sizes[op], dict(cfg.experiment.variants[op]))
        cost = {"op_wall_s": round(time.perf_counter() - started, 1), "op_compiles": compiled_kernels() - compiled}
        print(f"[kernels] {op}: {cost['op_wall_s']} s, {cost['op_compiles']} Triton compiles", flush=True)
        rows = [r.as_dict() | {"command": command, "copy_bandwidth_gbps": copy_gbps} | cost for r in rows]
        print(markdown_table(pd.DataFrame(rows)), flush=True)
        return rows

    store.run_units(units, compute, progress="kernel benchmarks")
    frame = store.frame(units)
    costs = ""
    if "op_compiles" in frame:
        per_op = frame.drop_duplicates("op")[["op", "op_wall_s", "op_compiles"]]
        costs = "\n\nWall time and Triton compiles per op (compiles included): " + "; ".join(
            f"{r.op} {r.op_wall_s:.0f} s, {r.op_compiles:.0f} compiles" for r in per_op.itertuples())
    (store.directory / "kernels.md").write_text(
        f"# Triton kernel benchmark\n\n```\n{header}\n```\n\nColumns: median µs (`triton.testing.do_bench`, L2 "
        f"flushed), GB/s = bytes that must move / time, floor = those bytes at the copy bandwidth measured in the "
        f"same run, speedup = baseline µs / time µs. Rows of ops resumed from an earlier run carry that run's "
        f"command in results.csv.{costs}\n\n{markdown_table(frame)}\n")
    return frame


def plot(df: pd.DataFrame, cfg: Any, figures_dir: str | Path) -> list[Path]:
    """Fraction of the byte floor reached by each kernel row (bars), one panel per op."""
    rows = df[~df["variant"].str.contains("no-lookup|baseline", regex=True)].drop_duplicates(["op", "variant", "size"])
    if rows.empty:
        return []
    from experiments.coverage import grid_coverage
    from experiments.plotting import figure_style, save_figure

    ops = list(dict.fromkeys(rows["op"]))
    with figure_style():
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(len(ops), 1, figsize=(9, 2.2 + 0.22 * len(rows)), squeeze=False,
                                 height_ratios=[max(1, (rows["op"] == op).sum()) for op in ops])
        for ax, op in zip(axes[:, 0], ops):
            part = rows[rows["op"] == op]
            labels = [f"{v} | {s}" for v, s in zip(part["variant"], part["size"])]
            ax.barh(range(len(part)), part["fraction_of_floor"], color="tab:blue")
            ax.set_yticks(range(len(part)), labels, fontsize=6)
            ax.invert_yaxis()
            ax.set_title(op, fontsize=9)
            ax.set_xlabel("byte floor / time (1 = at the copy bandwidth)")
        gpu = df["gpu"].iloc[0] if "gpu" in df else ""
        fig.suptitle(f"Triton kernels on {gpu}: fraction of the byte floor", fontsize=10)
        fig.tight_layout()
        return save_figure(fig, figures_dir, "kernels_fraction_of_floor", grid_coverage(cfg))


def _best(rows: pd.DataFrame) -> pd.Series | None:
    """The row with the largest speed-up over its baseline (diagnostic no-lookup variants excluded)."""
    rows = rows[~rows["variant"].str.contains("no-lookup")]
    return None if rows.empty else rows.loc[rows["speedup_vs_baseline"].idxmax()]


def paper_comparison(df: pd.DataFrame) -> list[dict[str, Any]]:
    """The blog's "up to 8x faster logits from 4-bit keys than from 32-bit keys" (our best 4-bit scores
    row against fp32 ``torch.matmul``), and the 4-bit decode speed-up over bf16 SDPA, each with the byte
    limit of the same run (baseline floor / our floor: the speed-up if both ran at the copy bandwidth)."""
    out = []
    scores = _best(df[(df["op"] == "scores") & (df["baseline"] == "fp32 matmul") & df["variant"].str.startswith("b=4")])
    if scores is not None:
        limit = 32 * HEAD_DIM / (4 * HEAD_DIM + 16)  # fp32 key bytes / (4-bit codes + fp16 norm)
        detail = (f"{scores['variant']}, {scores['size']}: {scores['time_us']:.0f} µs vs fp32 matmul "
                  f"{scores['baseline_us']:.0f} µs on {scores['gpu']}; byte limit {limit:.2f}x")
        out += [{"id": "kernels.scores_speedup_vs_fp32", "value": float(scores["speedup_vs_baseline"]), "detail": detail},
                {"id": "kernels.scores_speedup_byte_limit", "value": float(scores["speedup_vs_baseline"]), "detail": detail}]
    decode = _best(df[(df["op"] == "decode") & df["variant"].str.startswith("K4V4")])
    if decode is not None:
        base = df[(df["op"] == "decode") & (df["variant"] == "bf16 sdpa baseline") & (df["size"] == decode["size"])]
        limit = f"; byte limit {float(base['floor_us'].iloc[0]) / decode['floor_us']:.2f}x" if len(base) else ""
        out.append({"id": "kernels.decode_speedup_byte_limit", "value": float(decode["speedup_vs_baseline"]),
                    "detail": f"{decode['variant']}, {decode['size']}: {decode['time_us']:.0f} µs vs "
                              f"{decode['baseline']} {decode['baseline_us']:.0f} µs on {decode['gpu']}{limit}"})
    return out
