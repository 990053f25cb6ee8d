"""Needle-in-a-haystack with compressed KV caches (paper Fig. 4, arXiv v1).

Protocol (Kamradt's test as used by Fu et al. 2024 and the KV-cache papers):

1. Haystack: Paul Graham's essays (:mod:`experiments.data.haystack`), tokenized once with the model's
   tokenizer (repeated when a context is longer than the essays) and cut at the token where the whole chat
   prompt (system turn, haystack with the needle, question) is exactly ``context`` tokens long, as in
   Kamradt's test, which cuts its context by tokens.
2. Needle: "The best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny
   day." inserted as tokens at *depth* p: at the last sentence boundary at or before haystack token
   ``round(p * n)`` (p = 0: before the first sentence, p = 1: at the end). The depth actually reached
   (haystack tokens before the needle / all haystack tokens) is recorded per cell. Every prompt of a context
   has the same length, so the depths of one (method, seed, context) run as one batch (``batch_size`` rows at a
   time, a size of the scale; a batch row's cache is the cache that prompt alone would build).
3. The prompt (chat template) is prefilled into a fresh cache of the method, the answer decoded greedily;
   the cache's memory is recorded at the end, at its peak and averaged over forward passes, and a
   ``memory_ratio`` budget is enforced at the peak (:mod:`experiments.kv_generation`). With
   ``experiment.answer_logprob`` each cell also records the teacher-forced log-probability of the full
   cache's answer under the method's cache (a score that separates settings before the answers differ).
4. Score in [0, 1]: the needle's *answer words* (its content words that are not in the question:
   eat, sandwich, sit, dolores, park, sunny, day) found in the answer, as a fraction: ROUGE-1 recall of
   the answer words, case- and punctuation-insensitive, words compared after a light suffix stemmer
   (:func:`stem`, so "eating ... sitting" counts like "eat ... sit", as ROUGE with ``use_stemmer``).
   A verbatim answer scores 1, "eat a sandwich" 2/7, a wrong or empty answer 0. Repeating the question
   earns nothing. The score is a pure function of the stored answer, so :func:`run` re-scores stored
   cells whenever the scorer changes, without running the model again.

One unit of the :class:`~experiments.io.ResultStore` is one ``(method, options, context, depth)`` cell, so
a killed run resumes cell by cell. Methods that draw random state (TurboQuant's rotation, PolarQuant's)
run once per seed in ``experiment.method_seeds``; their scores are averaged over seeds and the spread
across seeds is reported (one rotation is one draw of the quantizer, and on a small model the score
depends on the draw). Every method runs at the same memory budget (``experiment.memory_ratio``,
25% of the 16-bit cache as in the paper); each cell records the cache's measured bytes and ratio.
"""

from __future__ import annotations

import itertools
import math
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
from matplotlib.colors import LinearSegmentedColormap
from tqdm.auto import tqdm

from experiments.coverage import GridCoverage, grid_coverage
from experiments.data.haystack import load_haystack
from experiments.io import STORE_COLUMNS, ResultStore, config_to_dict, experiment_sizes
from experiments.kv_generation import (KVMethod, answer_logprobs, generate_with_cache, kv_methods,
                                      with_current_labels)
from experiments.models import LoadedModel, load_model, model_spec_from_config
from experiments.plotting import figure_style, figure_title, save_figure

__all__ = [
    "RESULT_KEYS",
    "NeedleTask",
    "NeedlePrompt",
    "PromptBuilder",
    "answer_words",
    "needle_score",
    "stem",
    "sentence_boundaries",
    "insert_needle",
    "run",
    "plot",
    "summary_table",
    "paper_comparison",
    "cell_standard_error",
]

#: Version of the prompt protocol, part of every cell's unit: 2 = exact-length token prompts, memory budgets at
#: the peak (cells of protocol 1, string-cut prompts and steady-state budgets, are not reused).
PROTOCOL = 2

#: What a cell's score depends on beyond its unit keys (method + its options, context, depth).
RESULT_KEYS = ("experiment.name", "experiment.haystack", "experiment.task", "experiment.generation", "model", "seed")

# Function words dropped when choosing the needle's answer words (the question's words are dropped too).
_STOP_WORDS = frozenset(
    "a an and the to in on of at is are was be for with by it its this that as or from do does what which".split()
)
_WORD = re.compile(r"[a-z0-9]+")
# A sentence ends with . ! or ?, optionally followed by closing quotes/brackets, then whitespace.
_SENTENCE_END = re.compile(r"[.!?][\"')\]]*\s+")


# --------------------------------------------------------------------------- scoring
def stem(word: str) -> str:
    """Strip one inflectional suffix (-ing, -ed, -es, -s; not the s of -ss) and a doubled final consonant.

    sitting -> sit, eats -> eat, sandwiches -> sandwich, miss -> miss.
    """
    for suffix in ("ing", "ed", "es", "s"):
        if suffix == "s" and word.endswith("ss"):  # miss, glass: not a plural
            break
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            word = word[: -len(suffix)]
            if suffix in ("ing", "ed") and word[-1] == word[-2] and word[-1] not in "lsz":
                word = word[:-1]
            break
    return word


def _words(text: str) -> list[str]:
    return [stem(word) for word in _WORD.findall(text.lower().replace("'s", ""))]


def answer_words(needle: str, question: str) -> tuple[str, ...]:
    """The needle's content words absent from the question, in order, without repeats."""
    asked = set(_words(question))
    seen: dict[str, None] = {}
    for word in _words(needle):
        if word not in _STOP_WORDS and word not in asked:
            seen.setdefault(word)
    if not seen:
        raise ValueError(f"the needle {needle!r} has no content words beyond the question {question!r}")
    return tuple(seen)


def needle_score(answer: str, keywords: tuple[str, ...]) -> float:
    """ROUGE-1 recall of ``keywords`` in ``answer``: |keywords found| / |keywords| (0 for an empty answer)."""
    if not keywords:
        raise ValueError("needle_score needs at least one keyword")
    found = set(_words(answer))
    return sum(word in found for word in keywords) / len(keywords)


# --------------------------------------------------------------------------- haystack + needle
_CLOSERS = "\"')]"


def sentence_starts(pieces: list[str]) -> list[int]:
    """Token positions where a sentence may start, given each token's text: 0, every position after a token
    that ends a sentence ([.!?] then closing quotes/brackets) when whitespace follows, and the end."""
    starts = [0]
    for i in range(1, len(pieces)):
        before = pieces[i - 1].rstrip()
        ends_sentence = before.rstrip(_CLOSERS)[-1:] in (".", "!", "?")
        spaced = pieces[i - 1][-1:].isspace() or pieces[i][:1].isspace()
        if ends_sentence and spaced:
            starts.append(i)
    if starts[-1] != len(pieces):
        starts.append(len(pieces))
    return starts


@dataclass(frozen=True)
class NeedleTask:
    """The needle, its question, and the chat prompt around the haystack."""

    needle: str
    question: str
    system: str
    user_template: str  # with {context} and {question}
    answer_prefix: str = ""

    def __post_init__(self) -> None:
        for field_name in ("{context}", "{question}"):
            if field_name not in self.user_template:
                raise ValueError(f"task.user_template must contain {field_name}")

    @property
    def keywords(self) -> tuple[str, ...]:
        return answer_words(self.needle, self.question)


@dataclass(frozen=True)
class NeedlePrompt:
    """One cell's prompt: token ids and where the needle landed."""

    input_ids: torch.Tensor  # (1, context_length)
    context_length: int
    depth: float  # requested, in [0, 1]
    actual_depth: float  # haystack tokens before the needle / haystack tokens
    haystack_tokens: int
    haystack_repeats: bool  # the context is longer than the haystack: its tokens were repeated

    @property
    def prompt_tokens(self) -> int:
        return int(self.input_ids.shape[-1])


class PromptBuilder:
    """Builds needle prompts of exactly ``context_length`` tokens from one tokenized haystack."""

    _SLOT = "\uE000HAYSTACK\uE000"  # a private-use marker where the haystack goes in the chat template

    def __init__(self, tokenizer: Any, haystack: str, task: NeedleTask) -> None:
        self.tokenizer = tokenizer
        self.task = task
        self.haystack_ids = self._encode(haystack)
        if not self.haystack_ids:
            raise ValueError("the haystack is empty")
        chat = self._chat_text(self._SLOT)
        if chat.count(self._SLOT) != 1:
            raise ValueError("the chat template must contain the user's context exactly once")
        prefix, suffix = chat.split(self._SLOT)
        self.prefix_ids, self.suffix_ids = self._encode(prefix), self._encode(suffix)
        self.needle_ids = self._encode(" " + task.needle)
        self.overhead = len(self.prefix_ids) + len(self.suffix_ids)
        self._starts: dict[int, list[int]] = {}

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _chat_text(self, context: str) -> str:
        messages = []
        if self.task.system:
            messages.append({"role": "system", "content": self.task.system})
        user = self.task.user_template.format(context=context, question=self.task.question)
        messages.append({"role": "user", "content": user})
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return text + self.task.answer_prefix

    def _haystack(self, n_tokens: int) -> tuple[list[int], list[int]]:
        """The first ``n_tokens`` haystack tokens (the essays repeated as needed) and their sentence starts."""
        repeats = math.ceil(n_tokens / len(self.haystack_ids))
        ids = (self.haystack_ids * repeats)[:n_tokens]
        if n_tokens not in self._starts:
            pieces = self.tokenizer.batch_decode([[token] for token in ids])
            self._starts[n_tokens] = sentence_starts(pieces)
        return ids, self._starts[n_tokens]

    def build(self, context_length: int, depth: float) -> NeedlePrompt:
        """The prompt of exactly ``context_length`` tokens with the needle at ``depth`` (0..1)."""
        if not 0.0 <= depth <= 1.0:
            raise ValueError(f"depth must be in [0, 1], got {depth}")
        budget = context_length - self.overhead - len(self.needle_ids)
        if budget < 16:
            raise ValueError(
                f"context {context_length} tokens leaves no room for a haystack: the prompt without it takes "
                f"{self.overhead} tokens and the needle {len(self.needle_ids)}"
            )
        haystack, starts = self._haystack(budget)
        position = max(start for start in starts if start <= round(depth * budget))
        ids = self.prefix_ids + haystack[:position] + self.needle_ids + haystack[position:] + self.suffix_ids
        return NeedlePrompt(
            input_ids=torch.tensor([ids], dtype=torch.long),
            context_length=context_length,
            depth=depth,
            actual_depth=position / budget,
            haystack_tokens=budget,
            haystack_repeats=budget > len(self.haystack_ids),
        )


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

    def batches(missing: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
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

    store.run_units(units, compute, prepare=prepare, batches=batches,
                    progress=f"needle batches (<= {batch_size} cells)")
    if _rescore(store, units, task.keywords):
        tqdm.write("needle: re-scored stored answers with the current scorer")
    # the cells of this run's grid and methods: paper_comparison keeps only these rows of the config
    store.record_provenance(unit_ids=[store.unit_id(unit) for unit in units])
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


# --------------------------------------------------------------------------- tables
def _method_order(df: pd.DataFrame, order: list[str] | None) -> list[str]:
    """The methods present in ``df``, in ``order`` (the config's) where given, else first appearance."""
    present = list(dict.fromkeys(df["method"]))
    return [m for m in order if m in present] + [m for m in present if m not in order] if order else present


def seed_spread(rows: pd.DataFrame, column: str = "score") -> tuple[int, float]:
    """``(seeds, standard error)`` of a method's mean ``column`` over its seeds: the std of the per-seed means
    over sqrt(seeds) (NaN with one seed; the cells are shared by all seeds, so this is the spread due to
    the quantizer's random draw alone; rows without a ``method_seed`` column are one seed)."""
    seeds = rows["method_seed"].fillna(-1) if "method_seed" in rows else pd.Series(-1, index=rows.index)
    per_seed = rows.groupby(seeds, sort=False)[column].mean()
    n = len(per_seed)
    return n, float(per_seed.std(ddof=1) / math.sqrt(n)) if n > 1 else float("nan")


def summary_table(df: pd.DataFrame, order: list[str] | None = None) -> pd.DataFrame:
    """Mean score (over cells and seeds) and measured cache size per method (in ``order``, default first
    appearance), with the number of seeds and the standard error over seeds."""
    if df.empty:
        raise ValueError("no needle rows to summarise")
    order = _method_order(df, order)
    grouped = df.groupby("method", sort=False)
    spread = [seed_spread(grouped.get_group(m)) for m in order]
    table = pd.DataFrame(
        {
            "method": order,
            "label": [grouped.get_group(m)["method_label"].iloc[0] for m in order],
            "mean_score": [grouped.get_group(m)["score"].mean() for m in order],
            "seeds": [n for n, _ in spread],
            "score_se_over_seeds": [se for _, se in spread],
            "cells": [len(grouped.get_group(m)) for m in order],
            "bits_per_value": [grouped.get_group(m)["bits_per_value"].mean() for m in order],
            "memory_ratio": [grouped.get_group(m)["memory_ratio"].mean() for m in order],
            "peak_memory_ratio": [grouped.get_group(m)["peak_memory_ratio"].max() for m in order],
            "compression_ratio": [grouped.get_group(m)["compression_ratio"].mean() for m in order],
            "seconds_per_cell": [grouped.get_group(m)["seconds"].mean() for m in order],
            "gpu_peak_gib": [grouped.get_group(m)["gpu_peak_gib"].max() if "gpu_peak_gib" in df else np.nan
                             for m in order],
            "attention_path": [",".join(sorted(set(grouped.get_group(m)["attention_path"].astype(str))))
                               for m in order],
        }
    )
    random_weights = df.attrs.get("provenance", {}).get("model", {}).get("source") == "random_weights"
    paper = {} if random_weights else _paper_scores()  # a shape with random weights is timed, never judged
    table["paper_method"] = [str(grouped.get_group(m)["paper_method"].fillna("").iloc[0]) for m in order]
    table["paper_score_arxiv_v1"] = [paper.get(p, np.nan) for p in table["paper_method"]]
    table["model"] = df["model_label"].iloc[0]
    return table


def _paper_scores() -> dict[str, float]:
    from experiments.compare import load_paper_numbers

    prefix = "needle.score."
    return {n.id[len(prefix) :]: n.value for n in load_paper_numbers() if n.id.startswith(prefix)}


def write_tables(df: pd.DataFrame, cfg: Any, directory: Path) -> list[Path]:
    """``summary_<model>.csv`` and ``.md`` in the experiment's results folder (one pair per model;
    ``summary_<model>_partial.*`` for a run that left out part of its config's grid)."""
    table = summary_table(df, list(cfg.experiment.methods))
    coverage = grid_coverage(cfg)
    directory.mkdir(parents=True, exist_ok=True)
    stem = coverage.stem(f"summary_{df['model'].iloc[0]}")
    csv_path, md_path = directory / f"{stem}.csv", directory / f"{stem}.md"
    table.to_csv(csv_path, index=False)
    contexts = sorted(int(c) for c in df["context"].unique())
    by_context = df.pivot_table(index="method", columns="context", values="score", aggfunc="mean")
    lines = [
        f"# Needle-in-a-haystack, model: {table['model'].iloc[0]}",
        "",
        f"contexts {', '.join(str(c) for c in contexts)} tokens x {df['depth'].nunique()} depths; "
        "score = ROUGE-1 recall of the needle's answer words (experiments/needle.py); memory: mean at the end "
        "(peak over the generation).",
        "",
        "| method | mean score | ± SE over seeds | seeds | cells | " + " | ".join(_context_label(c) for c in contexts)
        + " | bits/value | memory ratio (peak) | s/cell | GPU peak GiB | read path | paper (arXiv v1, Llama-3.1-8B) |",
        "|---|---|---|---|---|" + "---|" * len(contexts) + "---|---|---|---|---|---|",
    ]
    for row in table.itertuples():
        paper = "" if math.isnan(row.paper_score_arxiv_v1) else f"{row.paper_score_arxiv_v1:.3f}"
        se = "" if math.isnan(row.score_se_over_seeds) else f"{row.score_se_over_seeds:.3f}"
        per_context = " | ".join("" if math.isnan(v) else f"{v:.3f}" for v in by_context.loc[row.method].reindex(contexts))
        lines.append(
            f"| {row.label} | {row.mean_score:.3f} | {se} | {row.seeds} | {row.cells} | {per_context} | "
            f"{row.bits_per_value:.2f} | {row.memory_ratio:.3f} ({row.peak_memory_ratio:.3f}) | "
            f"{row.seconds_per_cell:.2f} | {'' if math.isnan(row.gpu_peak_gib) else f'{row.gpu_peak_gib:.1f}'} | "
            f"{row.attention_path} | {paper} |"
        )
    md_path.write_text("\n".join(lines) + "\n")
    return [csv_path, md_path]


#: Compression figures (paper_numbers.yaml, table "compression"): (paper id, configured method key or
#: paper row, measured column, statistic over the run's cells).
_COMPRESSION_ROWS = (("compression.turboquant_3p5", "turboquant_3p5", "compression_ratio", "min"),
                     ("compression.at_least_6x", "turboquant_2p5", "compression_ratio", "min"),
                     ("compression.needle_budget", "paper:turboquant", "memory_ratio", "max"))


def cell_standard_error(rows: pd.DataFrame) -> float:
    """Standard error of a method's mean score over its (context, depth) cells (each cell averaged over
    seeds first): the sampling error of comparing the grid's mean with the paper's; NaN with one cell."""
    per_cell = rows.groupby(["context", "depth"])["score"].mean()
    return float(per_cell.std(ddof=1) / math.sqrt(len(per_cell))) if len(per_cell) > 1 else float("nan")


def paper_comparison(df: pd.DataFrame) -> list[dict[str, Any]]:
    """Mean needle score of each method that stands for one of the paper's (``paper_method`` set), with its
    standard error over cells, and the cache's measured compression for the paper's compression figures.

    Only the cells of the latest run's grid and method settings count (``unit_ids`` in the provenance).
    """
    if df.attrs.get("provenance", {}).get("model", {}).get("source") == "random_weights":
        return []  # a model shape with random weights: its scores are not the model's
    unit_ids = df.attrs.get("provenance", {}).get("unit_ids")
    if unit_ids is not None:  # rows of earlier grids / method settings under the same config are not this run's
        df = df[df["unit_id"].isin(set(unit_ids))]
    if df.empty:
        return []
    known = _paper_scores()
    out = []
    for paper_method, rows in df[df["paper_method"].fillna("").isin(known)].groupby("paper_method"):
        out.append(
            {
                "id": f"needle.score.{paper_method}",
                "value": float(rows["score"].mean()),
                "se": cell_standard_error(rows),
                "detail": (
                    f"{rows['method_label'].iloc[0]}, {len(rows)} cells (contexts "
                    f"{sorted(int(c) for c in rows['context'].unique())}), model {rows['model_label'].iloc[0]}, "
                    f"measured {rows['bits_per_value'].mean():.2f} bits/value"
                ),
            }
        )
    out += _gap_rows(df)
    for paper_id, method, column, statistic in _COMPRESSION_ROWS:
        rows = (df[df["paper_method"] == method.removeprefix("paper:")] if method.startswith("paper:")
                else df[df["method"] == method])
        if len(rows):
            out.append({"id": paper_id, "value": float(rows[column].agg(statistic)),
                        "detail": f"{rows['method_label'].iloc[0]}, {statistic} {column} over {len(rows)} cells, "
                                  f"model {rows['model_label'].iloc[0]}"})
    return out


#: Contexts where the full cache scores at least this are the ones the model handles (issue 18's criterion).
HANDLED_SCORE = 0.95


def _gap_rows(df: pd.DataFrame) -> list[dict[str, Any]]:
    """The paper's claim that TurboQuant matches the full cache (Fig. 4: 0.997 vs 0.997) as the per-cell difference
    ``TurboQuant - full`` (TurboQuant averaged over seeds per cell), over every cell and over the contexts the model
    handles (full >= 0.95 there), each with the standard error of the per-cell differences."""
    full = df[df["paper_method"] == "full"].groupby(["context", "depth"])["score"].mean()
    ours = df[df["paper_method"] == "turboquant"].groupby(["context", "depth"])["score"].mean()
    diff = (ours - full).dropna()
    if diff.empty:
        return []
    handled = [c for c, mean in full.groupby(level="context").mean().items() if mean >= HANDLED_SCORE]
    label = df.loc[df["paper_method"] == "turboquant", "method_label"].iloc[0]
    out = []
    for suffix, cells, where in (("", diff, "every cell"),
                                 ("_handled", diff[diff.index.get_level_values("context").isin(handled)],
                                  f"contexts where the full cache scores >= {HANDLED_SCORE} ({handled})")):
        if len(cells):
            se = float(cells.std(ddof=1) / math.sqrt(len(cells))) if len(cells) > 1 else float("nan")
            out.append({"id": f"needle.gap.turboquant_vs_full{suffix}", "value": float(cells.mean()), "se": se,
                        "detail": f"{label} - full cache, mean of {len(cells)} per-cell differences over {where}, "
                                  f"model {df['model_label'].iloc[0]}"})
    return out


# --------------------------------------------------------------------------- figure
#: Red (miss) - yellow - green (found), the palette of the Fu et al. / Kamradt heatmaps.
NEEDLE_CMAP = LinearSegmentedColormap.from_list("needle", ["#F0496E", "#EBB839", "#0CD79F"])


def _context_label(tokens: int) -> str:
    return f"{tokens / 1024:g}K" if tokens % 512 == 0 else f"{tokens / 1000:g}k"


def plot(df: pd.DataFrame, cfg: Any, figures_dir: str | Path) -> list[Path]:
    """One heatmap per method (context on x, depth on y, shared 0-1 colour scale), mean score in the title."""
    if df.empty:
        raise ValueError("no needle rows to plot")
    provenance = df.attrs.get("provenance", {})
    methods = _method_order(df, list(cfg.experiment.methods))
    contexts = sorted(int(c) for c in df["context"].unique())
    depths = sorted(float(d) for d in df["depth"].unique())
    ncols = min(4, len(methods))
    nrows = math.ceil(len(methods) / ncols)
    annotate = len(contexts) * len(depths) <= 120
    with figure_style():
        fig, axes = plt.subplots(
            nrows, ncols, figsize=(3.0 * ncols + 0.8, 2.8 * nrows + 1.0), squeeze=False, constrained_layout=True
        )
        image = None
        for ax, method in zip(axes.flat, methods):
            rows = df[df["method"] == method]
            grid = rows.pivot_table(index="depth", columns="context", values="score", aggfunc="mean")
            grid = grid.reindex(index=depths, columns=contexts)
            image = ax.imshow(grid.to_numpy(), cmap=NEEDLE_CMAP, vmin=0.0, vmax=1.0, aspect="auto")
            ax.set_xticks(range(len(contexts)), [_context_label(c) for c in contexts])
            ax.set_yticks(range(len(depths)), [f"{100 * d:g}%" for d in depths])
            ax.grid(False)
            if annotate:
                for (i, j), value in np.ndenumerate(grid.to_numpy()):
                    if not np.isnan(value):
                        ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=6)
            label = rows["method_label"].iloc[0]
            bits = rows["bits_per_value"].mean()
            ratio = rows["peak_memory_ratio"].max() if "peak_memory_ratio" in rows else rows["memory_ratio"].mean()
            seeds, se = seed_spread(rows)
            score = f"{rows['score'].mean():.3f}" + (f" ± {se:.3f} ({seeds} seeds)" if seeds > 1 else "")
            over = " (over budget)" if ratio > float(cfg.experiment.memory_ratio) + 1e-9 and ratio < 1 else ""
            ax.set_title(f"{textwrap.fill(label, 34)}\nmean {score}\n{bits:.2f} bits, peak {100 * ratio:.1f}% of 16-bit{over}")
            ax.set_xlabel("context length (tokens)")
            ax.set_ylabel("needle depth")
        for ax in list(axes.flat)[len(methods) :]:
            ax.set_visible(False)
        fig.colorbar(image, ax=axes, shrink=0.8, label="score")
        budget = float(cfg.experiment.memory_ratio)
        fig.suptitle(
            figure_title(
                f"Needle-in-a-haystack (paper Fig. 4), memory budget {100 * budget:g}% of the 16-bit KV cache at its "
                "peak (measured bits and peak % per panel)",
                provenance,
            )
        )
        return save_figure(fig, figures_dir, f"fig4_needle_{cfg.model.name}", grid_coverage(cfg))
