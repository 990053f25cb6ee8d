"""RULER with compressed KV caches: ``python run.py experiment=ruler``.

Protocol per sample (RULER's ``prepare.py`` + ``call_api.py`` + ``evaluate.py``, through the shipped package):

1. The package's generator for the task writes the sample (:mod:`experiments.ruler.samples`): the model's chat
   template around RULER's task template, the answer prefix after the generation prompt, ``max_seq_length`` =
   the context (prompt + RULER's generation length), in the model's tokens.
2. The prompt is prefilled into a fresh cache of the method and decoded greedily for RULER's generation length
   (``max_new_tokens_cap`` may lower it on a CPU; recorded), stopping at the end-of-turn token; the cache's memory
   is recorded at the end, at its peak and averaged (:mod:`experiments.kv_generation`).
3. The prediction is scored with the package's metric for the task (0-100).

One ResultStore unit is one (task, context, sample, method with its options and seed): a killed run resumes
sample by sample. Samples of one prompt length for the same method and seed decode as one batch (RULER's
prompts of one task differ in length by a few tokens, so most batches hold one sample). The summary table per
model (:mod:`experiments.ruler.table`) gives mean ± SE over samples per task × context × method, the seed
spread, and the gap to the full cache with its paired SE; the figure draws the task average per context and
each method's task × context grid.
"""

from __future__ import annotations

import json
import math
import os
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from experiments.coverage import frame_coverage
from experiments.data.cache import cache_root
from experiments.io import ResultStore, experiment_sizes
from experiments.kv_generation import KVMethod, generate_with_cache, kv_methods, method_draw, with_current_labels
from experiments.models import LoadedModel, load_model, model_spec_from_config
from experiments.plotting import figure_style, figure_title, save_figure
from experiments.ruler.library import RulerTask, check_dependencies, package_provenance, ruler_tasks, score_prediction
from experiments.ruler.samples import RulerSample, generate_sample_sets
from experiments.ruler.table import AVERAGE, summary_table

__all__ = ["RESULT_KEYS", "RulerSizes", "ruler_sizes", "unit_of", "missing_units", "sample_sets_for", "run",
           "stored_frame", "plot", "write_tables"]

#: Version of the protocol, part of every unit.
PROTOCOL = 1

#: Unit keys whose new value replaces a recorded sample of the same slot (ResultStore.record_units).
VERSIONED_KEYS = ("method_options", "protocol", "max_new_tokens_cap")

#: What a sample's score depends on beyond its unit keys: the model, the generators' seed and chat turn.
RESULT_KEYS = ("experiment.name", "experiment.random_seed", "experiment.system", "model", "seed")


@dataclass(frozen=True)
class RulerSizes:
    """``experiment.sizes.<scale>``: tasks, contexts (RULER's max_seq_length), samples per (task, context),
    the randomized methods' seeds, batch size and the CPU cap on generation lengths (None: RULER's)."""

    tasks: tuple[str, ...]
    contexts: tuple[int, ...]
    samples: int
    method_seeds: tuple[int, ...]
    batch_size: int
    max_new_tokens_cap: int | None

    def __post_init__(self) -> None:
        known = ruler_tasks()
        unknown = [t for t in self.tasks if t not in known]
        if unknown or not self.tasks:
            raise ValueError(f"experiment.sizes.<scale>.tasks: unknown or none {unknown}; RULER's: {list(known)}")
        if not self.contexts or min(self.contexts) <= 0:
            raise ValueError(f"experiment.sizes.<scale>.contexts must be positive token counts, got {self.contexts}")
        if self.samples < 1 or self.batch_size < 1:
            raise ValueError("experiment.sizes.<scale>.samples and batch_size must be >= 1")
        if not self.method_seeds or len(set(self.method_seeds)) != len(self.method_seeds):
            raise ValueError(f"experiment.sizes.<scale>.method_seeds must be distinct integers, got {self.method_seeds}")
        if self.max_new_tokens_cap is not None and self.max_new_tokens_cap < 1:
            raise ValueError("experiment.sizes.<scale>.max_new_tokens_cap must be >= 1 or null")


def ruler_sizes(cfg: Any) -> RulerSizes:
    sizes = experiment_sizes(cfg)
    cap = sizes.get("max_new_tokens_cap")
    return RulerSizes(tasks=tuple(str(t) for t in sizes.tasks), contexts=tuple(int(c) for c in sizes.contexts),
                      samples=int(sizes.samples), method_seeds=tuple(int(s) for s in sizes.method_seeds),
                      batch_size=int(sizes.get("batch_size", 1)), max_new_tokens_cap=None if cap is None else int(cap))


def _method_runs(methods: dict[str, KVMethod], seeds: tuple[int, ...]) -> list[tuple[KVMethod, int | None]]:
    """Each randomized method once per seed (its own ``seeds`` if set), every other method once."""
    return [(m.with_seed(s), s) for m in methods.values() if m.randomized for s in (m.seeds or seeds)] + \
        [(m, None) for m in methods.values() if not m.randomized]


def unit_of(method: KVMethod, task: str, context: int, sample: int, cap: int | None) -> dict[str, Any]:
    """The stored identity of one sample's result."""
    return {"method": method.key, "method_options": method.identity(), "task": task, "context": context,
            "sample": sample, "max_new_tokens_cap": cap or 0, "protocol": PROTOCOL}


def _units(cfg: Any, runs: list[tuple[KVMethod, int | None]]) -> list[dict[str, Any]]:
    """Every (context, task, sample, method run) unit of the configured grid, context-major."""
    sizes = ruler_sizes(cfg)
    return [unit_of(m, t, c, i, sizes.max_new_tokens_cap) for c in sizes.contexts for t in sizes.tasks
            for i in range(sizes.samples) for m, _ in runs]


def stored_frame(cfg: Any, store: ResultStore) -> pd.DataFrame:
    """The stored samples of the configured grid and methods (labels from the config), computing nothing."""
    methods = kv_methods(cfg)
    units = _units(cfg, _method_runs(methods, ruler_sizes(cfg).method_seeds))
    return with_current_labels(store.frame(units), methods)


def _max_new_tokens(task: RulerTask, cap: int | None) -> int:
    return min(task.tokens_to_generate, cap) if cap else task.tokens_to_generate


def _rows(loaded: LoadedModel, method: KVMethod, seed: int | None, task: RulerTask, batch: list[RulerSample],
          ids: dict[int, list[int]], max_new_tokens: int) -> list[dict[str, Any]]:
    """Decode one batch and score each row with RULER's metric."""
    input_ids = torch.tensor([ids[s.index] for s in batch], dtype=torch.long)
    result = generate_with_cache(loaded, input_ids, method.cache, method.options, max_new_tokens)
    rows = []
    for sample, text, new_tokens in zip(batch, result.texts, result.new_tokens):
        rows.append({
            "method_label": method.label, "paper_method": method.paper_method, "method_seed": seed,
            "task_kind": task.kind, "metric": task.metric, "model": loaded.spec.name, "model_label": loaded.label,
            "prompt_tokens": int(input_ids.shape[1]), "ruler_length": sample.length, "input_sha256": sample.sha256,
            # JSON strings: a column of numeric answers ("8090293") must still hold any text
            "references": json.dumps(list(sample.references), ensure_ascii=False),
            "prediction": json.dumps(text, ensure_ascii=False),
            "new_tokens": new_tokens, "max_new_tokens": max_new_tokens,
            "score": score_prediction(task, text, sample.references),
            "batch_size": len(batch), "seconds": result.seconds / len(batch),
            "cache_nbytes": result.cache_nbytes // len(batch), "memory_ratio": result.memory_ratio,
            "peak_memory_ratio": result.peak_memory_ratio, "mean_memory_ratio": result.mean_memory_ratio,
            "bits_per_value": result.bits_per_value, "compression_ratio": result.compression_ratio,
            "attention_path": result.attention_path,
            "gpu_peak_gib": None if result.gpu_peak_bytes is None else result.gpu_peak_bytes / 2**30,
        })
    return rows


def _describe(loaded: LoadedModel) -> dict[str, Any]:
    spec = loaded.spec
    return {"description": f"model: {loaded.label}; RULER samples and scoring: nvidia-long-context-eval==26.3",
            "substitution": f"{spec.display_name} stands in for {spec.substitutes_for}" if spec.substitutes_for else "",
            "model": loaded.provenance, "model_label": loaded.label, "ruler": package_provenance()}


def _workers() -> int:
    """Generator processes at once: half the cores (each holds RULER's 10M-word NIAH key list)."""
    return max(1, (os.cpu_count() or 2) // 2)


def missing_units(cfg: Any, store: ResultStore) -> list[dict[str, Any]]:
    """The units of the configured grid that ``store`` does not hold yet (of its shard): what :func:`run`
    computes."""
    return store.missing_units(_units(cfg, _method_runs(kv_methods(cfg), ruler_sizes(cfg).method_seeds)))


def sample_sets_for(cfg: Any, units: list[dict[str, Any]], tokenizer: Any
                    ) -> tuple[dict[tuple[str, int], list[RulerSample]], dict[tuple[str, int], str]]:
    """The sample sets of every (task, context) of ``units``, from the cache
    (``<cache>/ruler_samples/<model>``) or generated into it, and the (task, context) pairs that failed, with why.
    ``tokenizer`` must be the one the run loads (``load_model``): the cache key includes its fingerprint."""
    tasks = ruler_tasks()
    needed = list(dict.fromkeys((unit["task"], unit["context"]) for unit in units))
    return generate_sample_sets(
        [(tasks[t], c) for t, c in needed], tokenizer, num_samples=ruler_sizes(cfg).samples,
        random_seed=int(cfg.experiment.random_seed), system=str(cfg.experiment.system),
        cache_dir=cache_root() / "ruler_samples" / str(cfg.model.name),
        timeout_s=float(cfg.experiment.generation_timeout_s), workers=_workers())


def run(cfg: Any, store: ResultStore) -> pd.DataFrame:
    """Every (task, context, sample, method, seed) not yet in ``store``, context-major; writes the tables."""
    check_dependencies()
    sizes = ruler_sizes(cfg)
    spec = model_spec_from_config(cfg.model)
    tasks = ruler_tasks()
    if spec.max_context is not None and max(sizes.contexts) > spec.max_context:
        raise ValueError(f"context {max(sizes.contexts)} exceeds the model's {spec.max_context}-token window")
    methods = kv_methods(cfg)
    runs = _method_runs(methods, sizes.method_seeds)
    run_of = {(method.key, method.identity()): (method, seed) for method, seed in runs}
    cap = sizes.max_new_tokens_cap
    units = _units(cfg, runs)
    failures: dict[str, str] = {}  # a method (or a sample set) -> what went wrong

    def prepare(missing: list[dict[str, Any]]) -> tuple[LoadedModel, dict[tuple[str, int], dict[int, RulerSample]],
                                                        dict[tuple[str, int], dict[int, list[int]]]]:
        """The model, the samples of every (task, context) with a missing unit, and their token ids."""
        torch.manual_seed(int(cfg.seed))
        loaded = load_model(spec, device=cfg.scale.device)
        store.record_provenance(**_describe(loaded))
        sample_sets, failed = sample_sets_for(cfg, missing, loaded.tokenizer)
        for (name, context), why in failed.items():
            failures[f"{name} at {context}"] = f"sample generation: {why}"
            tqdm.write(f"ruler: {name} at {context} tokens skipped: {why}")
        samples = {key: {s.index: s for s in found} for key, found in sample_sets.items()}
        tokenize = loaded.tokenizer
        ids = {key: {index: tokenize(s.text, add_special_tokens=False)["input_ids"] for index, s in found.items()}
               for key, found in samples.items()}
        return loaded, samples, ids

    def batches(missing: list[dict[str, Any]], prepared: Any) -> list[list[dict[str, Any]]]:
        """The missing samples of one (task, context, method run) whose prompts have one length, ``batch_size``
        at a time, in the units' order; a (task, context) whose samples failed to generate is left missing."""
        _, samples, ids = prepared
        groups: dict[tuple[Any, ...], dict[int, list[dict[str, Any]]]] = {}
        for unit in missing:
            key = (unit["task"], unit["context"])
            if key in samples:
                length = len(ids[key][unit["sample"]])
                run_key = (*key, unit["method"], unit["method_options"])
                groups.setdefault(run_key, {}).setdefault(length, []).append(unit)
        return [group[i:i + sizes.batch_size] for by_length in groups.values() for group in by_length.values()
                for i in range(0, len(group), sizes.batch_size)]

    def compute(batch: list[dict[str, Any]], prepared: Any) -> list[list[dict[str, Any]]] | None:
        loaded, samples, ids = prepared
        task, context = tasks[batch[0]["task"]], batch[0]["context"]
        method, seed = run_of[(batch[0]["method"], batch[0]["method_options"])]
        key = f"{method.key} (seed {seed})"
        if key in failures:
            return None  # this method already failed: its other batches would fail the same way
        try:
            rows = _rows(loaded, method, seed, task, [samples[(task.name, context)][u["sample"]] for u in batch],
                         ids[(task.name, context)], _max_new_tokens(task, cap))
        except (RuntimeError, ValueError) as error:  # the other methods' samples are still worth computing
            failures[key] = f"{task.name} at {context}: {type(error).__name__}: {error}"
            tqdm.write(f"ruler: {key}: {failures[key]}")
            return None
        return [[row] for row in rows]

    # first: a process killed mid-run still counts its cells
    store.record_units(units, versioned=VERSIONED_KEYS, replicate=method_draw)
    store.run_units(units, compute, prepare=prepare, batches=batches, progress="ruler batches")
    frame = with_current_labels(store.frame(units), methods)
    if not frame.empty:
        write_tables(frame, cfg, store.directory)
    if failures:
        raise RuntimeError(f"ruler: {len(failures)} part(s) failed (every other sample is stored; rerun to resume):\n  "
                           + "\n  ".join(f"{k}: {v}" for k, v in failures.items()))
    return frame


# --------------------------------------------------------------------------- tables
def _reference(df: pd.DataFrame) -> str | None:
    full = df.loc[df["paper_method"] == "full", "method"]
    return str(full.iloc[0]) if len(full) else None


def _fmt(value: float, digits: int = 1) -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def write_tables(df: pd.DataFrame, cfg: Any, directory: Path) -> list[Path]:
    """``summary_<model>.csv`` (every task x context x method row) and ``.md`` (the task average per context
    and method, then each task); ``summary_<model>_partial.*`` for a run that left out part of its grid."""
    table = summary_table(df, list(cfg.experiment.methods), _reference(df))
    stem = frame_coverage(cfg, df).stem(f"summary_{df['model'].iloc[0]}")
    directory.mkdir(parents=True, exist_ok=True)
    csv_path, md_path = directory / f"{stem}.csv", directory / f"{stem}.md"
    table.to_csv(csv_path, index=False)
    lines = [f"# RULER, model: {df['model_label'].iloc[0]}", "",
             "Score 0-100 (nvidia-long-context-eval==26.3's metric), mean ± SE over samples (each averaged over "
             "the method's seeds); gap = method - full cache on the same samples, ± paired SE; average = mean "
             "over tasks. Peak memory as a fraction of the 16-bit cache (experiments/ruler/).", "",
             "| task | context | method | score | ± SE | samples | seeds | ± SE over seeds | gap to full | ± paired SE "
             "| peak memory |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    ordered = pd.concat([table[table["task"] == AVERAGE], table[table["task"] != AVERAGE]])
    for row in ordered.itertuples():
        lines.append(f"| {row.task} | {row.context} | {row.method_label} | {_fmt(row.mean)} | {_fmt(row.se)} | "
                     f"{row.samples} | {row.seeds} | {_fmt(row.seed_se)} | {_fmt(row.gap)} | {_fmt(row.gap_se)} | "
                     f"{_fmt(row.peak_memory_ratio, 3)} |")
    md_path.write_text("\n".join(lines) + "\n")
    return [csv_path, md_path]


# --------------------------------------------------------------------------- figure
def plot(df: pd.DataFrame, cfg: Any, figures_dir: str | Path) -> list[Path]:
    """Left: the task average per context and method (± SE); then one task x context heatmap per method."""
    if df.empty:
        raise ValueError("no RULER rows to plot")
    table = summary_table(df, list(cfg.experiment.methods), _reference(df))
    methods = list(dict.fromkeys(table["method"]))
    contexts = sorted(int(c) for c in table["context"].unique())
    tasks = [t for t in dict.fromkeys(table["task"]) if t != AVERAGE]
    ncols = min(4, len(methods) + 1)
    nrows = math.ceil((len(methods) + 1) / ncols)
    with figure_style():
        fig, axes = plt.subplots(nrows, ncols, figsize=(3.4 * ncols + 0.8, 3.2 * nrows + 1.0), squeeze=False,
                                 constrained_layout=True)
        flat = list(axes.flat)
        average = table[table["task"] == AVERAGE]
        tasks_stored = table[table["task"] != AVERAGE].groupby(["method", "context"])["task"].nunique()
        for method in methods:
            rows = average[average["method"] == method].set_index("context").reindex(contexts)
            whole = np.array([tasks_stored.get((method, c), 0) == len(tasks) for c in contexts])
            line = flat[0].errorbar(np.flatnonzero(whole), rows["mean"][whole], yerr=rows["se"][whole], marker="o",
                                    capsize=3, label=method)
            # an average over some of the tasks is not comparable with the others': drawn hollow, not joined
            flat[0].plot(np.flatnonzero(~whole), rows["mean"][~whole], "o", mfc="none", color=line[0].get_color())
        flat[0].set_xticks(range(len(contexts)), [f"{c / 1024:g}K" for c in contexts])
        flat[0].set(xlabel="context (tokens)", ylabel="RULER score (average over tasks)", ylim=(0, 100),
                    title=f"average over {len(tasks)} tasks\n(hollow: some tasks not stored yet)")
        flat[0].legend(fontsize=6)
        image = None
        for ax, method in zip(flat[1:], methods):
            rows = table[(table["method"] == method) & (table["task"] != AVERAGE)]
            grid = rows.pivot_table(index="task", columns="context", values="mean").reindex(index=tasks, columns=contexts)
            image = ax.imshow(grid.to_numpy(), cmap="viridis", vmin=0, vmax=100, aspect="auto")
            ax.set_xticks(range(len(contexts)), [f"{c / 1024:g}K" for c in contexts])
            ax.set_yticks(range(len(tasks)), tasks, fontsize=6)
            ax.grid(False)
            for (i, j), value in np.ndenumerate(grid.to_numpy()):
                if not np.isnan(value):
                    ax.text(j, i, f"{value:.0f}", ha="center", va="center", fontsize=5, color="w" if value < 60 else "k")
            peak = rows["peak_memory_ratio"].max()
            ax.set_title(f"{textwrap.fill(str(rows['method_label'].iloc[0]), 34)}\npeak {100 * peak:.1f}% of 16-bit")
        for ax in flat[len(methods) + 1:]:
            ax.set_visible(False)
        if image is not None:
            fig.colorbar(image, ax=flat[1:len(methods) + 1], shrink=0.8, label="score")
        fig.suptitle(figure_title("RULER (nvidia-long-context-eval 26.3 generators and metric) with compressed KV "
                                  "caches", df.attrs.get("provenance", {})))
        return save_figure(fig, figures_dir, f"ruler_{cfg.model.name}", frame_coverage(cfg, df))
