"""``run``: every (method, seed, context, depth) cell through a fresh compressed cache (protocol step 3), stored
cell by cell in the :class:`~experiments.io.ResultStore`; stored answers re-scored when the scorer changes."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from experiments.data.haystack import load_haystack
from experiments.io import ResultStore, STORE_COLUMNS, config_to_dict, experiment_sizes
from experiments.kv_generation import (KVMethod, answer_logprobs, generate_with_cache, kv_methods, method_draw,
                                       with_current_labels)
from experiments.models import LoadedModel, load_model, model_spec_from_config
from experiments.needle.prompts import NeedlePrompt, NeedleTask, PromptBuilder
from experiments.needle.scoring import needle_score
from experiments.needle.table import write_tables

#: Version of the prompt protocol, part of every cell's unit: 2 = exact-length token prompts, memory budgets at
#: the peak (cells of protocol 1, string-cut prompts and steady-state budgets, are not reused).
PROTOCOL = 2

#: Unit keys whose new value replaces a recorded cell of the same slot (ResultStore.record_units).
VERSIONED_KEYS = ("method_options", "protocol")

#: What a cell's score depends on beyond its unit keys (method + its options, context, depth).
RESULT_KEYS = ("experiment.name", "experiment.haystack", "experiment.task", "experiment.generation", "model", "seed")


# --------------------------------------------------------------------------- one batch of cells
def run_batch(
    loaded: LoadedModel, prompts: list[NeedlePrompt], cache_method: str, options: dict[str, Any], max_new_tokens: int
) -> list[dict[str, Any]]:
    """Prefill + greedy decode prompts of one length with one fresh cache; per prompt the answer, and the batch's
    timing and cache accounting (every row's cache is the same size: the prompts have the same length)."""
    lengths = {p.prompt_tokens for p in prompts}
    if len(lengths) != 1:
        raise ValueError(f"a batch holds prompts of one length, got lengths {sorted(lengths)}")
    input_ids = torch.cat([p.input_ids for p in prompts])
    result = generate_with_cache(loaded, input_ids, cache_method, options, max_new_tokens)
    shared = {
        "batch_size": len(prompts),
        "seconds": result.seconds / len(prompts),
        "cache_nbytes": result.cache_nbytes // len(prompts),
        "memory_ratio": result.memory_ratio,
        "peak_memory_ratio": result.peak_memory_ratio,
        "mean_memory_ratio": result.mean_memory_ratio,
        "bits_per_value": result.bits_per_value,
        "compression_ratio": result.compression_ratio,
        "attention_path": result.attention_path,
        "gpu_peak_gib": None if result.gpu_peak_bytes is None else result.gpu_peak_bytes / 2**30,
    }
    return [{"answer": text.strip(), "answer_tokens": tokens, **shared}
            for text, tokens in zip(result.texts, result.new_tokens)]


def _reference_answers(store: ResultStore, units: list[dict[str, Any]]) -> list[str | None]:
    """The stored answers of ``units`` (the full cache's cells), None where a cell is not stored."""
    frame = store.frame(units)
    by_id = dict(zip(frame["unit_id"], frame["answer"].fillna("").astype(str))) if not frame.empty else {}
    return [by_id.get(store.unit_id(unit)) for unit in units]


# --------------------------------------------------------------------------- experiment
def _task(cfg: Any) -> NeedleTask:
    task = config_to_dict(cfg.experiment.task)
    return NeedleTask(
        needle=task["needle"],
        question=task["question"],
        system=task.get("system", ""),
        user_template=task["user_template"],
        answer_prefix=task.get("answer_prefix", ""),
    )


def _grid(cfg: Any, max_context: int | None, max_new_tokens: int) -> tuple[list[int], list[float]]:
    sizes = experiment_sizes(cfg)
    contexts = [int(c) for c in sizes.contexts]
    depths = [float(d) for d in sizes.depths]
    if not contexts or not depths:
        raise ValueError("experiment.sizes.<scale> needs non-empty 'contexts' and 'depths'")
    bad = [d for d in depths if not 0.0 <= d <= 1.0]
    if bad:
        raise ValueError(f"depths are fractions in [0, 1]; got {bad}")
    if max_context is not None and max(contexts) + max_new_tokens > max_context:
        raise ValueError(
            f"context {max(contexts)} + {max_new_tokens} answer tokens exceeds the model's {max_context}-token "
            "window; pick another model"
        )
    return contexts, depths


def _describe(loaded: LoadedModel, haystack_source: dict[str, Any]) -> dict[str, Any]:
    haystack = f"{haystack_source['package']}=={haystack_source['version']}"
    spec = loaded.spec
    return {
        "description": f"model: {spec.display_name}; haystack: Paul Graham essays ({haystack})",
        "substitution": f"{spec.display_name} stands in for {spec.substitutes_for}" if spec.substitutes_for else "",
        "model": loaded.provenance,
        "model_label": loaded.label,
        "haystack": haystack_source,
    }


def _method_seeds(cfg: Any) -> list[int]:
    """``experiment.method_seeds``: the random states each randomized method is run with (default: ``[seed]``)."""
    seeds = cfg.experiment.get("method_seeds")
    seeds = [int(cfg.seed)] if seeds is None else [int(s) for s in seeds]
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"experiment.method_seeds must be distinct integers, got {seeds}")
    return seeds


def method_runs(methods: dict[str, KVMethod], seeds: list[int]) -> list[tuple[KVMethod, int | None]]:
    """Each method once per seed (its own ``seeds`` or ``seeds``) if it draws random state (rotations, QJL),
    else once (seed ``None``)."""
    runs: list[tuple[KVMethod, int | None]] = []
    for method in methods.values():
        if not method.randomized:
            runs.append((method, None))
            continue
        runs += [(method.with_seed(seed), seed) for seed in (method.seeds or seeds)]
    return runs


def unit_of(method: KVMethod, context: int, depth: float) -> dict[str, Any]:
    """The stored identity of one cell."""
    return {"method": method.key, "method_options": method.identity(), "context": context, "depth": depth,
            "protocol": PROTOCOL}


def stored_frame(cfg: Any, store: ResultStore) -> pd.DataFrame:
    """The stored cells of the configured grid and methods (labels from the config), computing nothing."""
    spec = model_spec_from_config(cfg.model)
    contexts, depths = _grid(cfg, spec.max_context, int(cfg.experiment.generation.max_new_tokens))
    methods = kv_methods(cfg)
    units = [unit_of(m, c, d) for c in contexts for m, _ in method_runs(methods, _method_seeds(cfg)) for d in depths]
    return with_current_labels(store.frame(units), methods)


def _batch_size(cfg: Any) -> int:
    """``experiment.sizes.<scale>.batch_size``: depths decoded together (1 = one prompt at a time)."""
    size = experiment_sizes(cfg).get("batch_size", 1)
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"experiment.sizes.<scale>.batch_size must be an integer >= 1, got {size!r}")
    return size


def run(cfg: Any, store: ResultStore) -> pd.DataFrame:
    """Every (method, seed, context, depth) cell not yet in ``store``, the depths of a (method, seed, context) in
    batches of ``experiment.sizes.<scale>.batch_size``; writes the summary table; the frame."""
    spec = model_spec_from_config(cfg.model)
    max_new_tokens = int(cfg.experiment.generation.max_new_tokens)
    contexts, depths = _grid(cfg, spec.max_context, max_new_tokens)
    methods = kv_methods(cfg)
    runs = method_runs(methods, _method_seeds(cfg))
    task = _task(cfg)
    batch_size = _batch_size(cfg)
    score_logprob = bool(cfg.experiment.get("answer_logprob", False))
    reference = next((m for m in methods.values() if m.cache == "full"), None)
    if score_logprob and reference is None:
        raise ValueError("experiment.answer_logprob scores the full cache's answer: add the 'full' method")

    # context-major: a run stopped early leaves complete grids at the shorter contexts for every method
    units = [unit_of(method, c, d) for c in contexts for method, _ in runs for d in depths]
    run_of = {(method.key, method.identity()): (method, seed) for method, seed in runs}
    failures: dict[str, str] = {}  # method key -> what went wrong

    def batches(missing: list[dict[str, Any]], _prepared: Any) -> list[list[dict[str, Any]]]:
        """The missing depths of one (method, seed, context), ``batch_size`` at a time."""
        groups = itertools.groupby(missing, key=lambda unit: (unit["method"], unit["method_options"], unit["context"]))
        return [cells[i:i + batch_size] for _, group in groups for cells in [list(group)]
                for i in range(0, len(cells), batch_size)]

    def prepare(_) -> tuple[LoadedModel, PromptBuilder]:
        torch.manual_seed(int(cfg.seed))
        loaded = load_model(spec, device=cfg.scale.device)
        haystack = load_haystack(cfg.experiment.haystack)
        store.record_provenance(**_describe(loaded, haystack.source))
        return loaded, PromptBuilder(loaded.tokenizer, haystack.text, task)

    def compute(batch: list[dict[str, Any]], prepared: tuple[LoadedModel, PromptBuilder]) -> list[list[dict]] | None:
        loaded, builder = prepared
        context, batch_depths = batch[0]["context"], [unit["depth"] for unit in batch]
        method, seed = run_of[(batch[0]["method"], batch[0]["method_options"])]
        if method.key in failures:
            return None  # this method already failed: its other batches would fail the same way
        prompts = [builder.build(context, depth) for depth in batch_depths]
        try:
            results = run_batch(loaded, prompts, method.cache, method.options, max_new_tokens)
        except (RuntimeError, ValueError) as error:  # the other methods' cells are still worth computing
            failures[method.key] = f"{method.key} (seed {seed}, context {context}): {type(error).__name__}: {error}"
            tqdm.write(f"needle: {failures[method.key]}")
            return None
        if score_logprob:
            answers = ([r["answer"] for r in results] if method.key == reference.key else
                       _reference_answers(store, [unit_of(reference, context, d) for d in batch_depths]))
            answer_ids = [loaded.tokenizer(a, add_special_tokens=False)["input_ids"] if a else [] for a in answers]
            logprobs = answer_logprobs(loaded, torch.cat([p.input_ids for p in prompts]), answer_ids,
                                       method.cache, method.options)
            for result, value, ids in zip(results, logprobs, answer_ids):
                result.update(reference_answer_logprob=value, reference_answer_tokens=len(ids))
        return [[{
            "method_label": method.label,
            "paper_method": method.paper_method,
            "method_seed": seed,
            "haystack": cfg.experiment.haystack,
            "model": spec.name,
            "model_label": loaded.label,
            "prompt_tokens": prompt.prompt_tokens,
            "haystack_tokens": prompt.haystack_tokens,
            "actual_depth": prompt.actual_depth,
            "haystack_repeats": prompt.haystack_repeats,
            "score": needle_score(result["answer"], task.keywords),
            **result,
        }] for prompt, result in zip(prompts, results)]

    # the cells of this run's grid and methods, merged with other invocations': paper_comparison counts these.
    # Recorded first, so that a process killed mid-run (a device call's time limit) still counts its cells.
    store.record_units(units, versioned=VERSIONED_KEYS, replicate=method_draw)
    store.run_units(units, compute, prepare=prepare, batches=batches,
                    progress=f"needle batches (<= {batch_size} cells)")
    if _rescore(store, units, task.keywords):
        tqdm.write("needle: re-scored stored answers with the current scorer")
    frame = stored_frame(cfg, store)
    if not frame.empty:
        write_tables(frame, cfg, store.directory)
    if failures:
        raise RuntimeError(f"needle: {len(failures)} method(s) failed (every other cell is stored; rerun to "
                           "resume):\n  " + "\n  ".join(failures.values()))
    return frame


def _rescore(store: ResultStore, units: list[dict[str, Any]], keywords: tuple[str, ...]) -> int:
    """Rewrite the stored cells whose score is not the current scorer's score of their answer; how many."""
    frame = store.frame(units)
    if frame.empty:
        return 0
    fresh = frame["answer"].fillna("").astype(str).map(lambda answer: needle_score(answer, keywords))
    stale = frame.index[~np.isclose(fresh.to_numpy(float), frame["score"].to_numpy(float))]
    by_id = {store.unit_id(unit): unit for unit in units}
    for index in stale:
        unit = by_id[frame.at[index, "unit_id"]]
        row = {k: v for k, v in frame.loc[index].items() if k not in STORE_COLUMNS and k not in unit}
        store.save_unit(unit, [{**row, "score": float(fresh[index])}])
    return len(stale)
