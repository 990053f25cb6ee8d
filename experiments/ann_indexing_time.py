"""Paper Table 2 (arXiv v1 only): time to build a 4-bit index of 100k vectors, per dimension and method,
plus search throughput (queries/s) at a stated recall, TurboQuant vs faiss PQ / PQ fast-scan / RaBitQ.

What is timed, identically for every method (same process, same threads, stated in every row):

* ``build_s = train_s + add_s``: learning from the base set (k-means codebooks for PQ, the centroid for
  RaBitQ, nothing for the data-oblivious TurboQuant) plus encoding every base vector. This is what the
  paper's Table 2 calls quantization/indexing time. ``setup_s`` (constructing the method: TurboQuant's
  rotation Π and Lloyd-Max codebook, which depend only on (d, b, seed)) is reported beside it.
* A warm-up build on a small slice runs first and is not counted (library loading, allocator growth).
* Builds are repeated ``repeats`` times and the median kept, unless one build takes longer than
  ``cheap_s`` seconds (then it is timed once; ``repeats_done`` says which).
* TurboQuant is built once per rotation in ``rotations`` and per quantizer backend in ``backends``
  (``auto``: the fused numba CPU encoder when numba is installed; ``torch``: the reference path), so the
  fast path and the reference are timed in the same run; every row states the ``backend`` asked for,
  the ``encoder`` that really ran and the threads. The codes of the backends agree (bit for bit with
  Haar, up to float32 ties with Hadamard), so search is timed on the first backend's index only.
* TurboQuant is also built on each CUDA device in ``devices`` (the Triton encoder; faiss methods stay on the
  CPU). Such a build's ``add_s`` goes through the index API, host array in and packed codes back on the
  host, so it includes both PCIe copies; an ``encode_resident`` row beside it times the quantizer alone on
  data already on the GPU (CUDA-synchronised, median of ``repeats``), which is what the paper's GPU column
  measures.
* Search: after a warm-up query, the held-out queries are searched in one batch and the first
  ``single_queries`` one at a time (queries/s for each, the fastest of ``search_repeats`` passes, with the
  median beside it); recall@1@1 and recall@1@k at the search ``k`` on
  the timed queries are stated with each throughput. TurboQuant is timed with each CPU scorer on the same
  codes (``fastscan``: faiss fast-scan candidates + exact re-rank; ``dense``: decode a chunk + one GEMM;
  ``lut``: per-query byte lookup tables, one query at a time only); ``exact`` (faiss IndexFlatIP, an fp32
  brute-force matrix product) is the uncompressed reference.

Data: uniform random unit vectors at the paper's dimensions (d = 200, 1536, 3072: timing depends on the
dimension, not on the data) and the embedded real sets at their own dimensions. The paper's rows, next
to which ``table2_markdown`` prints ours: arXiv v1 Table 2 (TurboQuant on an A100; PQ and RaBitQ on CPU,
RaBitQ a single-core Python port) and the RaBitQ authors' symmetric re-timing (arXiv 2604.19528).
"""

from __future__ import annotations

import os
import platform
import statistics
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from omegaconf import OmegaConf
from tqdm import tqdm

from experiments.ann_recall import (
    METHOD_LABELS,
    BuiltIndex,
    build_index,
    config_hash,
    exact_top1,
    load_ann_dataset,
    markdown_table,
    set_threads,
)
from experiments.coverage import GridCoverage, grid_coverage
from experiments.data.embeddings import EmbeddingDataset
from experiments.io import ResultStore, experiment_sizes
from experiments.plotting import figure_style, save_figure
from turboquant.ann import TrainingSizeWarning, TurboQuantIndex, VectorIndex, recall_at_1_at_k

__all__ = ["PAPER_TABLE2", "RABITQ_RETIMING", "RESULT_KEYS", "plot", "run", "table2_markdown"]

RESULT_KEYS = ("experiment.name", "experiment.bits", "experiment.normalize", "scale.name", "seed")

#: arXiv v1 Table 2: seconds to quantize 100k vectors at 4 bits (TurboQuant on an A100; PQ on CPU;
#: RaBitQ a Python port on one CPU core, as an author confirmed). Removed in the ICLR 2026 version.
PAPER_TABLE2: dict[str, dict[int, float]] = {
    "pq": {200: 37.04, 1536: 239.75, 3072: 494.42},
    "rabitq": {200: 597.25, 1536: 2267.59, 3072: 3957.19},
    "turboquant": {200: 0.0007, 1536: 0.0013, 3072: 0.0021},
}
#: The RaBitQ authors' symmetric re-timing (arXiv 2604.19528), 4-bit, 100k vectors, seconds.
RABITQ_RETIMING: dict[str, dict[int, float]] = {
    "RaBitQ (CPU)": {200: 0.125, 1536: 1.003, 3072: 4.176},
    "RaBitQ (GPU)": {200: 0.009, 1536: 0.065, 3072: 0.152},
    "TurboQuant (GPU)": {200: 0.011, 1536: 0.114, 3072: 0.276},
}


def _data_specs(cfg: Any) -> list[tuple[str, Any]]:
    """(data name, dataset config) for every entry of ``sizes.<scale>.data``.

    An entry is a key of ``experiment.datasets`` (e.g. ``glove50``) or ``<key>:<dim>`` to override the
    dimension of a synthetic set (``random_sphere:1536``).
    """
    specs = []
    for entry in experiment_sizes(cfg).data:
        key, _, dim = str(entry).partition(":")
        if key not in cfg.experiment.datasets:
            raise ValueError(f"data entry {entry!r}: no dataset {key!r} under experiment.datasets")
        dataset_cfg = OmegaConf.to_container(cfg.experiment.datasets[key], resolve=False)
        if dim:
            dataset_cfg["dim"] = int(dim)
        specs.append((f"{key}_d{dim}" if dim else key, OmegaConf.create(dataset_cfg)))
    return specs


def _timed_builds(method: str, bits: int, data: EmbeddingDataset, options: dict[str, Any], repeats: int,
                  cheap_s: float) -> tuple[list[BuiltIndex], BuiltIndex]:
    """Warm up on a slice, then build ``repeats`` times (once if a build is slower than ``cheap_s``). The warm-up
    compiles and allocates; its training may be short of the method's recommended rows (PQ's: 39 x 256)."""
    bits = None if method == "exact" else bits  # the fp32 reference has no bit width
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TrainingSizeWarning)
        build_index(method, data.dim, bits, data.base[:2048], **options)
    builds = [build_index(method, data.dim, bits, data.base, **options)]
    while len(builds) < repeats and builds[0].build_s <= cheap_s:
        builds.append(build_index(method, data.dim, bits, data.base, **options))
    return builds, builds[-1]


def _median(builds: list[BuiltIndex], phase: str) -> float:
    return statistics.median(getattr(b, phase) for b in builds)


def _throughput(index: VectorIndex, queries: np.ndarray, k: int, batches: list[tuple[int, int]],
                truth: np.ndarray, repeats: int) -> list[dict[str, Any]]:
    """queries/s for each (batch, n_timed): ``batch`` queries per ``search`` call over the first ``n_timed``
    queries, timed ``repeats`` times; ``queries_per_s`` is the fastest pass (on a shared CPU the others
    carry other processes' load), ``queries_per_s_median`` the median. With each: the recall@1@1 /
    recall@1@k reached on those queries.

    Warm-up (not timed): one query; a search through Triton kernels is also run once at every timed batch
    size, since the kernels are compiled per shape (unwarmed, the first 1000-query batch on the H200 read
    394 queries/s against 65,000 once compiled)."""
    index.search(queries[:1], k)
    rows = []
    for batch, n_timed in batches:
        timed = queries[:n_timed]
        if getattr(index, "kernel_search", False):
            index.search(timed[:batch], k)
        passes = []
        for _ in range(max(1, repeats)):
            ids = []
            start = time.perf_counter()
            for first in range(0, n_timed, batch):
                ids.append(index.search(timed[first : first + batch], k)[1])
            passes.append(time.perf_counter() - start)
        recall = recall_at_1_at_k(truth[:n_timed], np.concatenate(ids), [1, k])
        rows.append({"measure": "search", "batch": batch, "queries_timed": n_timed,
                     "queries_per_s": n_timed / min(passes), "queries_per_s_median": n_timed / statistics.median(passes),
                     "search_repeats": len(passes), "search_k": k, "recall_at_1": recall[1], "recall_at_k": recall[k]})
    return rows


def _scorer_twin(index: TurboQuantIndex, scorer: str) -> TurboQuantIndex:
    """The same stored codes behind another CPU scorer (no re-quantization)."""
    twin = TurboQuantIndex(**{**index.config(), "scorer": scorer})
    twin.load_state_arrays(index.state_arrays())
    return twin


def _timed_indexes(index: VectorIndex, batches: list[tuple[int, int]]) -> dict[str, tuple[VectorIndex, list]]:
    """scorer label -> (index, batches) to time: each CPU scorer of a TurboQuant index on the same codes
    (per-query lookup tables cost m·n·d/g gathers: one query at a time only); other indexes as they are."""
    if not isinstance(index, TurboQuantIndex):
        return {"": (index, batches)}
    if index.kernel_search:
        return {"kernel": (index, batches)}  # codes on the GPU: no CPU scorer there
    timed = {"dense": (_scorer_twin(index, "dense"), batches)}
    if index.supports_fastscan:
        timed = {"fastscan": (_scorer_twin(index, "fastscan"), batches), **timed}
    if index.supports_lut:
        timed["lut"] = (_scorer_twin(index, "lut"), [(1, batches[-1][1])])
    return timed


def _devices(cfg: Any) -> list[str]:
    """``experiment.devices``, checked: "cpu" and CUDA devices that exist here."""
    devices = [str(device) for device in cfg.experiment.get("devices", ["cpu"])]
    for device in devices:
        if device != "cpu" and not (device.startswith("cuda") and torch.cuda.is_available()):
            raise ValueError(f"experiment.devices lists {device!r}, but this machine has no such device "
                             f"(CUDA available: {torch.cuda.is_available()}); use devices=[cpu]")
    return devices


def _method_runs(cfg: Any) -> list[tuple[str, dict[str, Any]]]:
    """(method, constructor options) pairs: TurboQuant once per device in ``devices``, rotation in
    ``rotations`` and backend in ``backends``; faiss methods once, on the CPU."""
    runs = []
    for method in cfg.experiment.methods:
        if method.startswith("turboquant"):
            runs += [(method, {"rotation": r, "seed": int(cfg.seed), "backend": b, "device": device})
                     for device in _devices(cfg) for r in cfg.experiment.rotations for b in cfg.experiment.backends]
        else:
            runs.append((method, {}))
    return runs


def _resident_encode(index: TurboQuantIndex, base: np.ndarray, repeats: int) -> dict[str, Any]:
    """Median seconds of the index's quantizer on ``base`` already on its CUDA device (synchronised)."""
    x = torch.from_numpy(base).to(index.device)
    quantize = index.quantizer.quantize
    quantize(x[: min(2048, len(x))])  # warm-up (kernel compilation)
    times = []
    for _ in range(max(1, repeats)):
        torch.cuda.synchronize(index.device)
        start = time.perf_counter()
        quantize(x)
        torch.cuda.synchronize(index.device)
        times.append(time.perf_counter() - start)
    return {"measure": "encode_resident", "add_s": statistics.median(times), "build_s": statistics.median(times),
            "build_s_min": min(times), "repeats_done": len(times)}


def run(cfg: Any, store: ResultStore) -> pd.DataFrame:
    exp = cfg.experiment
    sizes = experiment_sizes(cfg)
    threads = set_threads(int(exp.threads))
    machine = {"cpu": platform.processor() or platform.machine(), "torch": torch.__version__, **threads,
               "gpus": [torch.cuda.get_device_name(device) for device in _devices(cfg) if device != "cpu"]}
    bits = int(exp.bits)
    provenance = dict(store.provenance().get("datasets", {}))
    all_units = []
    for name, dataset_cfg in _data_specs(cfg):
        units, options_of = [], {}
        for method, options in _method_runs(cfg):
            unit = {"data": name, "dataset_config_id": config_hash(dataset_cfg), "n_base": int(sizes.n_base),
                    "n_queries": int(sizes.n_queries), "method": method, "rotation": options.get("rotation", ""),
                    "backend": options.get("backend", ""), "device": options.get("device", "cpu")}
            options_of[_unit_key(unit)] = options
            units.append(unit)
        all_units += units

        def prepare(_missing: list[dict[str, Any]]) -> tuple[Any, Any]:  # called within this iteration
            data = load_ann_dataset(name, dataset_cfg, int(sizes.n_base), int(sizes.n_queries), int(cfg.seed),
                                    bool(exp.normalize))
            provenance[name] = data.provenance()
            store.record_provenance(datasets=provenance, machine=machine,
                                    description="; ".join(p["description"] for p in provenance.values()))
            return data, exact_top1(data)

        def compute(unit: dict[str, Any], prepared: tuple[Any, Any]) -> list[dict[str, Any]]:
            data, truth = prepared
            options = options_of[_unit_key(unit)]
            builds, built = _timed_builds(unit["method"], bits, data, options, int(exp.repeats), float(exp.cheap_s))
            encoder = built.index.encoder if isinstance(built.index, TurboQuantIndex) else "faiss"
            on_gpu = unit["device"] != "cpu"
            common = {"dim": data.dim, "bits": bits, "bits_per_coordinate": built.index.bits_per_coordinate,
                      "encoder": encoder, "gpu": torch.cuda.get_device_name(unit["device"]) if on_gpu else "",
                      "cpu_cores": os.cpu_count(), **threads}
            rows = [{
                "measure": "build", "scorer": "", "build_s": _median(builds, "build_s"),
                "train_s": _median(builds, "train_s"), "add_s": _median(builds, "add_s"),
                "setup_s": _median(builds, "setup_s"), "build_s_min": min(b.build_s for b in builds),
                "repeats_done": len(builds), "load_average": os.getloadavg()[0], **common,
            }]
            if on_gpu:
                rows.append({**_resident_encode(built.index, data.base, int(exp.repeats)), "scorer": "", **common})
            n_queries, single = data.queries.shape[0], int(exp.single_queries)
            indexes = _timed_indexes(built.index, [(n_queries, n_queries), (1, single)])
            if unit["backend"] and unit["backend"] != exp.backends[0]:
                indexes = {}  # same codes as the first backend's index: its search is timed there
            for scorer, (index, index_batches) in indexes.items():
                for row in _throughput(index, data.queries, int(exp.search_k), index_batches, truth,
                                       int(exp.search_repeats)):
                    rows.append({**row, "scorer": scorer, "load_average": os.getloadavg()[0], **common})
            return rows

        store.run_units(units, compute, prepare=prepare, progress=f"ann_indexing_time {name}")
    return store.frame(units=all_units)


def _unit_key(unit: dict[str, Any]) -> tuple[str, str, str, str]:
    """What tells a unit's method run apart (its options beyond these are the config's)."""
    return unit["method"], unit["rotation"], unit["backend"], unit["device"]


def _label(method: str, rotation: str, encoder: str = "", backend: str = "", gpu: str = "") -> str:
    """e.g. ``TurboQuant_mse (hadamard, numba via auto)`` or ``TurboQuant_mse (haar, triton via auto, NVIDIA
    H200)``: the method, its rotation, the encoder that ran, the backend asked for when it was chosen
    automatically, and the GPU when it ran on one."""
    label = METHOD_LABELS.get(method, method)
    ran = "" if encoder == "faiss" else encoder
    if ran and backend and backend != encoder:
        ran = f"{ran} via {backend}"
    details = [part for part in (rotation, ran, gpu) if isinstance(part, str) and part]
    return f"{label} ({', '.join(details)})" if details else label


def _with_labels(df: pd.DataFrame) -> pd.DataFrame:
    df = df.copy()
    for column in ("rotation", "backend", "encoder", "gpu"):
        df[column] = df[column].fillna("") if column in df else ""
    df["method_label"] = [_label(*labels) for labels in
                          zip(df["method"], df["rotation"], df["encoder"], df["backend"], df["gpu"])]
    return df


def _fast_turboquant(builds: pd.DataFrame, method: str, rotation: str) -> pd.DataFrame:
    """The rows of ``method`` with ``rotation`` built by the fastest encoder present (numba/triton, else torch)."""
    rows = builds[(builds["method"] == method) & (builds["rotation"] == rotation)]
    for encoder in ("triton", "numba", "torch"):
        if (rows["encoder"] == encoder).any():
            return rows[rows["encoder"] == encoder]
    return rows


#: (method, paper-numbers label, dimension) rows of Table 2 that experiments/paper_numbers.yaml lists
PAPER_ROWS = (("turboquant_mse", "turboquant", 200), ("turboquant_mse", "turboquant", 1536),
              ("turboquant_mse", "turboquant", 3072), ("pq", "pq", 200), ("pq", "pq", 1536), ("pq", "pq", 3072),
              ("rabitq", "rabitq", 200), ("rabitq", "rabitq", 1536), ("rabitq", "rabitq", 3072))
#: Rows of the RaBitQ authors' re-timing (paper_numbers.yaml: ann_indexing_time.retiming.*) the same timings face
RETIMING_ROWS = {("rabitq", "this run's CPU"): "rabitq_cpu", ("turboquant", "data resident on the GPU"): "turboquant_gpu"}


def paper_comparison(df: pd.DataFrame) -> list[dict[str, Any]]:
    """Build seconds of 100k-vector indexes on random unit vectors at the paper's dimensions (Table 2), also
    set beside the RaBitQ authors' re-timing (RaBitQ on the CPU, TurboQuant on a GPU).

    TurboQuant as the paper's Haar rotation: timed on a GPU with the data already there when such a row
    exists (the paper's A100 column), else the fastest CPU encoder of the run (``rank`` 1: a GPU run's row
    comes first in the comparison)."""
    df = _with_labels(df[(df["n_base"] == 100_000) & df["build_s"].notna()])
    builds, resident = df[df["measure"] == "build"], df[df["measure"] == "encode_resident"]
    out = []
    for method, label, dim in PAPER_ROWS:
        data = f"random_sphere_d{dim}"
        rows, where = builds[(builds["data"] == data) & (builds["method"] == method)], "this run's CPU"
        if method == "turboquant_mse":
            on_gpu = resident[(resident["data"] == data) & (resident["method"] == method)
                              & (resident["rotation"] == "haar")]
            rows, where = ((on_gpu, "data resident on the GPU") if len(on_gpu)
                           else (_fast_turboquant(builds[builds["data"] == data], method, "haar"), where))
        if len(rows):
            row = rows.iloc[-1]
            load = row.get("load_average", float("nan"))
            threads = "" if row["gpu"] else (f", {int(row['faiss_threads'])} faiss / {int(row['torch_threads'])} torch threads"
                                             + ("" if pd.isna(load) else f", 1-min load average {load:.1f}"))
            item = {"value": float(row["build_s"]), "detail": f"{row['method_label']}{threads}, {where}",
                    "rank": int(method == "turboquant_mse" and not row["gpu"])}  # the paper timed TurboQuant on a GPU
            out.append({"id": f"ann_indexing_time.seconds.{label}.d{dim}", **item})
            if (label, where) in RETIMING_ROWS:
                out.append({"id": f"ann_indexing_time.retiming.{RETIMING_ROWS[label, where]}.d{dim}", **item})
    return out


def _ratio_lines(timings: pd.DataFrame) -> list[str]:
    """PQ training time and PQ build time over each TurboQuant time (build rows, and encode_resident rows
    marked as such), per data set (same run)."""
    lines = []
    for data, part in timings.groupby("data"):
        pq = part[(part["method"] == "pq") & (part["measure"] == "build")]
        if pq.empty:
            continue
        train_s, build_s = float(pq["train_s"].iloc[0]), float(pq["build_s"].iloc[0])
        for _, tq_row in part[part["method"].str.startswith("turboquant")].iterrows():
            resident = " [data on the GPU]" if tq_row["measure"] == "encode_resident" else ""
            lines.append(f"- {data}: PQ training {train_s:.4g} s (build {build_s:.4g} s) / {tq_row['method_label']}"
                         f"{resident} {tq_row['build_s']:.4g} s = {train_s / tq_row['build_s']:.0f}x "
                         f"(build: {build_s / tq_row['build_s']:.0f}x)")
    return lines


def _encoder_speedups(builds: pd.DataFrame) -> list[str]:
    """Torch-path build time over fast-encoder build time for the same TurboQuant variant (same run)."""
    lines = []
    tq_builds = builds[builds["method"].str.startswith("turboquant")]
    for (data, method, rotation), part in tq_builds.groupby(["data", "method", "rotation"]):
        reference = part[part["encoder"] == "torch"]
        for _, fast in part[part["encoder"] != "torch"].iterrows():
            if len(reference):
                ref_s = float(reference["build_s"].iloc[0])
                lines.append(f"- {data}, {method} ({rotation}): torch {ref_s:.4g} s / {fast['encoder']} "
                             f"{fast['build_s']:.4g} s = {ref_s / fast['build_s']:.1f}x")
    return lines


def table2_markdown(df: pd.DataFrame) -> str:
    """Our build times per (data, method) next to arXiv v1 Table 2 and the RaBitQ authors' re-timing."""
    df = _with_labels(df)
    builds = df[df["measure"] == "build"]
    table = builds.pivot_table(index="method_label", columns="data", values="build_s", aggfunc="first")
    table = table[sorted(table.columns, key=lambda data: int(builds.loc[builds["data"] == data, "dim"].iloc[0]))]
    loads = builds["load_average"].dropna() if "load_average" in builds else pd.Series(dtype=float)
    load_text = f"; 1-min load average {loads.min():.2f}-{loads.max():.2f} during the builds" if len(loads) else ""
    lines = [
        "# Indexing time (seconds), 4 bits: this machine vs the paper's Table 2 (arXiv v1)",
        "",
        f"Ours: median wall time of train + add, {int(builds['n_base'].iloc[0])} vectors (" + _threads_text(df)
        + f"); {_machine_text(df)}{load_text} (the CPU is shared, so absolute times carry load noise). In parentheses: "
        "rotation and the encoder that ran (numba = fused CPU encoder, torch = reference path; "
        "'via auto' = chosen by backend='auto'); nan = not run.",
        "",
        markdown_table(table.reset_index(), "{:.4g}"),
        "",
        "Paper, arXiv v1 Table 2 (TurboQuant on an A100 GPU; PQ on CPU; RaBitQ a single-core Python port):",
        "",
        markdown_table(pd.DataFrame(PAPER_TABLE2).T.reset_index().rename(columns={"index": "method"}), "{:g}"),
        "",
        "RaBitQ authors' symmetric re-timing (arXiv 2604.19528):",
        "",
        markdown_table(pd.DataFrame(RABITQ_RETIMING).T.reset_index().rename(columns={"index": "method"}), "{:g}"),
        "",
        "## PQ training time / TurboQuant indexing time (same run, same data)",
        "",
        *_ratio_lines(df[df["measure"].isin(["build", "encode_resident"])]),
    ]
    resident = df[df["measure"] == "encode_resident"]
    if not resident.empty:
        table = resident.pivot_table(index="method_label", columns="data", values="add_s", aggfunc="first")
        lines += ["", "## TurboQuant on the GPU, data already on the device (median seconds, CUDA-synchronised)", "",
                  ("The build rows above for the same GPU go through `TurboQuantIndex.add`: host array in, codes "
                   "back on the host, so they include both PCIe copies."), "", markdown_table(table.reset_index(), "{:.4g}")]
    speedups = _encoder_speedups(builds)
    if speedups:
        lines += ["", "## TurboQuant encoders: torch reference / fast path (same run)", "", *speedups]
    searches = df[df["measure"] == "search"].copy()
    if not searches.empty:
        searches["method"] = _search_labels(searches)
        cols = ["data", "method", "batch", "queries_timed", "queries_per_s", "search_k", "recall_at_1", "recall_at_k"]
        lines += ["", "## Search throughput (same run)", "", markdown_table(searches[cols], "{:.3g}")]
    return "\n".join(lines) + "\n"


def _machine_text(df: pd.DataFrame) -> str:
    """e.g. ``2-core CPU; GPU rows: NVIDIA H200``, from the rows' ``cpu_cores`` and ``gpu`` columns."""
    gpu = df["gpu"].fillna("") if "gpu" in df else pd.Series("", index=df.index)
    cpu_rows = df[gpu == ""]
    cores = sorted({int(c) for c in cpu_rows["cpu_cores"].dropna()}) if "cpu_cores" in df else []
    parts = [f"{'/'.join(map(str, cores))}-core CPU" if cores else "CPU"] if len(cpu_rows) else []
    gpus = sorted(set(gpu) - {""})
    return "; ".join(parts + ([f"GPU rows: {', '.join(gpus)}"] if gpus else []))


def _threads_text(df: pd.DataFrame) -> str:
    parts = []
    for column, name in (("faiss_threads", "faiss OpenMP"), ("torch_threads", "torch"), ("numba_threads", "numba")):
        if column in df:
            parts.append(f"{name} threads {sorted(set(df[column].dropna().astype(int)))}")
    return ", ".join(parts)


def plot(df: pd.DataFrame, cfg: Any, figures_dir: str | Path) -> list[Path]:
    """Build time against dimension (log scale) per method, and the Table 2 comparison as Markdown."""
    if df.empty:
        return []
    df = _with_labels(df)
    builds = df[df["measure"] == "build"]
    resident = df[df["measure"] == "encode_resident"].assign(method_label=lambda d: d["method_label"] + " [data on GPU]")
    with figure_style():
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        groups = list(pd.concat([builds, resident]).groupby("method_label", sort=False))
        palette = plt.get_cmap("tab20").colors  # dark shades first, then light; greys are the paper's
        colors = [palette[i] for i in (*range(0, 20, 2), *range(1, 20, 2)) if i not in (14, 15)]
        markers = "osD^vP*X<>"
        for i, (label, part) in enumerate(groups):
            part = part.sort_values("dim")
            ax.plot(part["dim"], part["build_s"], marker=markers[i % len(markers)], color=colors[i % len(colors)],
                    label=label)
        for shade, (method, times) in zip(("0.15", "0.4", "0.65"), PAPER_TABLE2.items()):
            ax.plot(list(times), list(times.values()), ls=":", marker="x", color=shade, label=f"paper Table 2: {method}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        dims = sorted({int(d) for d in builds["dim"]} | {int(d) for times in PAPER_TABLE2.values() for d in times})
        ax.set_xticks(dims, [str(d) for d in dims])
        ax.xaxis.set_minor_locator(plt.NullLocator())
        ax.set_xlabel("dimension d")
        ax.set_ylabel("index build time (s): train + add")
        n_base = int(builds["n_base"].iloc[0])
        loads = builds["load_average"].dropna() if "load_average" in builds else pd.Series(dtype=float)
        load = f", load avg {loads.min():.1f}-{loads.max():.1f}" if len(loads) else ""
        ax.set_title(f"Indexing time, {int(builds['bits'].iloc[0])} bits, {n_base} vectors, {_machine_text(df)}{load}\n"
                     f"({_threads_text(df)})\nvs arXiv v1 Table 2 (TurboQuant on A100, RaBitQ 1-core Python)", fontsize=7)
        ax.legend(fontsize=5.5, loc="center left", bbox_to_anchor=(1.01, 0.5))
        fig.tight_layout()
        fig.text(0.01, -0.02, _data_note(df), fontsize=6, va="top", ha="left")
        stem = f"ann_indexing_time_{n_base // 1000}k"  # quick (20k) and paper (100k) runs keep separate files
        coverage = grid_coverage(cfg)
        paths = save_figure(fig, figures_dir, stem, coverage)
    table = Path(figures_dir) / f"{coverage.stem(stem)}_table2.md"
    table.write_text(table2_markdown(df))
    return [*paths, *_plot_qps_recall(df, figures_dir, f"ann_qps_recall_{n_base // 1000}k", coverage), table]


def _data_note(df: pd.DataFrame) -> str:
    """``Data (one point per set and method): <name> (d=…): <description>`` per data set, from the run's
    provenance (the name alone when none is recorded), wrapped for a figure footnote."""
    import textwrap

    provenance = df.attrs.get("provenance", {}).get("datasets", {})
    dims = df.groupby("data")["dim"].first().sort_values()
    lines = [f"{name} (d={int(dim)}): {provenance.get(name, {}).get('description', 'no description recorded')}"
             for name, dim in dims.items()]
    return "Data (one point per data set and method):\n" + "\n".join(textwrap.fill(line, 140) for line in lines)


def _search_labels(searches: pd.DataFrame) -> pd.Series:
    """Index label plus the TurboQuant scorer, e.g. ``TurboQuant_mse (hadamard, numba via auto) [fastscan]``."""
    return pd.Series([label + (f" [{s}]" if isinstance(s, str) and s else "")
                      for label, s in zip(searches["method_label"], searches["scorer"])], index=searches.index)


def _plot_qps_recall(df: pd.DataFrame, figures_dir: str | Path, stem: str, coverage: GridCoverage) -> list[Path]:
    """Queries/s against recall@1@k (k = the search k), one panel per data set, every index and scorer:
    filled markers for the batched search, open markers for one query at a time (ANN-benchmarks' plot)."""
    searches = df[df["measure"] == "search"].copy()
    if searches.empty:
        return []
    searches["index_label"] = _search_labels(searches)
    datasets = sorted(set(searches["data"]), key=lambda data: int(searches.loc[searches["data"] == data, "dim"].iloc[0]))
    labels = list(dict.fromkeys(searches["index_label"]))
    k = int(searches["search_k"].iloc[0])
    with figure_style():
        import matplotlib.pyplot as plt

        palette = plt.get_cmap("tab20").colors
        colors = {label: palette[(2 * i) % 20 + (2 * i) // 20] for i, label in enumerate(labels)}
        fig, axes = plt.subplots(1, len(datasets), figsize=(4.2 * len(datasets) + 3.2, 4.0), squeeze=False)
        for ax, data in zip(axes[0], datasets):
            part = searches[searches["data"] == data]
            for _, row in part.iterrows():
                batched = int(row["batch"]) > 1
                ax.scatter(row["recall_at_k"], row["queries_per_s"], s=36, marker="o" if batched else "^",
                           color=colors[row["index_label"]], facecolors=None if batched else "none")
            ax.set_yscale("log")
            ax.set_xlabel(f"recall@1@{k}")
            ax.set_ylabel("queries / s")
            dim = int(part["dim"].iloc[0])
            ax.set_title(f"{data} (d={dim}, {int(part['bits'].iloc[0])} bits, n={int(part['n_base'].iloc[0])})", fontsize=8)
        handles = [plt.Line2D([], [], ls="", marker="s", color=colors[label], label=label) for label in labels]
        handles += [plt.Line2D([], [], ls="", marker="o", color="k", label=f"batch of {int(searches['batch'].max())}"),
                    plt.Line2D([], [], ls="", marker="^", color="k", markerfacecolor="none", label="one query at a time")]
        axes[0][-1].legend(handles=handles, fontsize=5.5, loc="center left", bbox_to_anchor=(1.02, 0.5))
        loads = searches["load_average"].dropna() if "load_average" in searches else pd.Series(dtype=float)
        load = f", load avg {loads.min():.1f}-{loads.max():.1f}" if len(loads) else ""
        fig.suptitle(f"Search throughput vs recall@1@{k}, same run ({_machine_text(df)}{load}; {_threads_text(df)})",
                     fontsize=8)
        fig.tight_layout()
        searches.attrs = df.attrs
        fig.text(0.01, -0.02, _data_note(searches), fontsize=6, va="top", ha="left")
        return save_figure(fig, figures_dir, stem, coverage)
