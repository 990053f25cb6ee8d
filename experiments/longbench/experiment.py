"""LongBench-E with compressed KV caches (paper Table 1, arXiv v1).

Protocol (LongBench's ``pred.py`` + ``eval.py``, per sample):

1. Fill the dataset's template with the sample (:mod:`experiments.longbench.prompts`).
2. If the prompt has more than ``max_length`` tokens, keep the first and last ``max_length // 2`` (each half
   decoded back to text, as LongBench does).
3. Chat template, except on trec / triviaqa / samsum / lcc / repobench-p (continuation tasks).
4. Prefill into a fresh cache of the method, decode greedily up to the dataset's maximum new tokens
   (``max_new_tokens_cap`` may lower it for CPU runs; recorded). samsum also stops at a newline. On the
   datasets scored on one line only (trec, triviaqa, samsum: the first line; lcc, repobench-p: the first
   line without a comment marker) decoding stops once that line is complete: the score cannot change.
5. Score with the dataset's metric, max over reference answers (:mod:`experiments.longbench.metrics`).

One ResultStore unit is one (method, dataset, sample): a killed run resumes sample by sample. The table has
the paper's six category columns and the 13-dataset Average (:mod:`experiments.longbench.table`), plus
per-dataset scores and LongBench-E's length buckets; it names the model and data actually used.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from experiments.coverage import frame_coverage
from experiments.io import ResultStore, config_to_dict, experiment_sizes
from experiments.kv_generation import generate_with_cache, kv_methods, method_draw, with_current_labels
from experiments.longbench.builders import whitespace_tokens
from experiments.longbench.data import DataSpec, data_spec_from_config, describe_data, load_samples
from experiments.longbench.metrics import DATASET_METRIC, FIRST_LINE_DATASETS, LENGTH_BUCKETS, length_bucket, score_sample
from experiments.longbench.prompts import DATASETS, DatasetSpec, dataset_spec, format_prompt, truncate_middle
from experiments.longbench.sample import LongBenchSample
from experiments.longbench.table import CATEGORIES, CATEGORY_OF, PAPER_TABLE1, summary_table
from experiments.models import LoadedModel, load_model, model_spec_from_config
from experiments.plotting import figure_style, figure_title, save_figure

__all__ = ["RESULT_KEYS", "build_input_ids", "generate", "run", "stored_frame", "plot", "tables", "paper_comparison",
           "write_tables"]

#: What a sample's score depends on beyond its unit keys (method, dataset, sample, budgets).
RESULT_KEYS = ("experiment.name", "longbench_data", "model", "seed")

#: Unit keys whose new value replaces a recorded sample of the same slot (ResultStore.record_units).
VERSIONED_KEYS = ("method_options",)

_CODE_DATASETS = frozenset({"lcc", "repobench-p"})


# --------------------------------------------------------------------------- prompt
def build_input_ids(tokenizer: Any, spec: DatasetSpec, sample: LongBenchSample, max_length: int) -> tuple[torch.Tensor, bool]:
    """Token ids (1, n) of the sample's prompt after LongBench's truncation and (maybe) chat template."""
    prompt = format_prompt(spec.name, sample.to_record())
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    truncated = len(ids) > max_length
    if truncated:
        kept = truncate_middle(ids, max_length)
        half = len(kept) // 2
        prompt = tokenizer.decode(kept[:half], skip_special_tokens=True) + tokenizer.decode(
            kept[half:], skip_special_tokens=True
        )
    if spec.use_chat_template and getattr(tokenizer, "chat_template", None):
        encoded = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True, return_dict=True
        )
        input_ids = encoded["input_ids"]
    else:
        input_ids = tokenizer(prompt)["input_ids"]  # with the tokenizer's own special tokens, as LongBench
    return torch.tensor([list(input_ids)], dtype=torch.long), truncated


# --------------------------------------------------------------------------- decoding
def scored_line_complete(dataset: str, text: str) -> bool:
    """True once ``text`` holds, as a finished line, everything the dataset's metric will read."""
    if dataset not in FIRST_LINE_DATASETS and dataset not in _CODE_DATASETS:
        return False
    lines = text.lstrip("\n").split("\n")
    finished = lines[:-1]  # the last piece may still grow
    if dataset in FIRST_LINE_DATASETS:
        return bool(finished)
    return any("`" not in line and "#" not in line and "//" not in line for line in finished)


class _ScoredLineStop:
    """A transformers stopping criterion: stop when :func:`scored_line_complete` holds."""

    def __init__(self, tokenizer: Any, dataset: str, prompt_length: int) -> None:
        self.tokenizer, self.dataset, self.prompt_length = tokenizer, dataset, prompt_length

    def __call__(self, input_ids: torch.Tensor, scores: Any, **_: Any) -> torch.Tensor:
        text = self.tokenizer.decode(input_ids[0, self.prompt_length :], skip_special_tokens=True)
        done = scored_line_complete(self.dataset, text)
        return torch.full((input_ids.shape[0],), done, dtype=torch.bool, device=input_ids.device)


def generate(
    loaded: LoadedModel,
    input_ids: torch.Tensor,
    spec: DatasetSpec,
    max_new_tokens: int,
    cache_method: str,
    options: Mapping[str, Any],
) -> dict[str, Any]:
    """Greedy decoding of one prompt with a fresh cache of ``cache_method``; prediction and cache accounting."""
    from transformers import StoppingCriteriaList

    tokenizer = loaded.tokenizer
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    newline = tokenizer.encode("\n", add_special_tokens=False)
    if spec.stop_at_newline and newline:  # samsum: LongBench adds the newline token to the end-of-sequence ids
        eos.append(newline[-1])
    result = generate_with_cache(
        loaded, input_ids, cache_method, options, max_new_tokens, eos_token_ids=eos, min_new_tokens=1,
        stopping_criteria=StoppingCriteriaList([_ScoredLineStop(tokenizer, spec.name, input_ids.shape[-1])]),
    )
    return {
        "prediction": result.text,
        "new_tokens": result.new_token_count,
        "seconds": result.seconds,
        "cache_nbytes": result.cache_nbytes,
        "memory_ratio": result.memory_ratio,
        "bits_per_value": result.bits_per_value,
        "attention_path": result.attention_path,
    }


# --------------------------------------------------------------------------- experiment
def _datasets(cfg: Any) -> list[str]:
    names = list(cfg.experiment.datasets)
    unknown = [n for n in names if n not in DATASETS]
    if unknown:
        raise ValueError(f"experiment.datasets has unknown names {unknown}; known: {list(DATASETS)}")
    return names


def _token_counter(tokenizer: Any):
    return lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])


def _units(cfg: Any, methods: Mapping[str, Any], count_tokens: Any
           ) -> tuple[list[dict[str, Any]], dict[tuple[Any, ...], LongBenchSample]]:
    """The configured (method, dataset, sample) units in sample-major order (an interrupted run has covered every
    dataset about equally), and each unit's sample by (task, sample_id, context_budget). The embedded data is
    built to budgets counted by ``count_tokens``; its sample ids do not depend on the counter."""
    sizes = experiment_sizes(cfg)
    context_tokens = [int(c) for c in sizes.context_tokens]
    cap = sizes.get("max_new_tokens_cap")
    data = data_spec_from_config(config_to_dict(cfg.longbench_data))
    datasets = _datasets(cfg)
    per_dataset = {ds: load_samples(data, ds, int(sizes.samples_per_dataset), context_tokens, int(cfg.seed),
                                    count_tokens) for ds in datasets}
    units: list[dict[str, Any]] = []
    samples: dict[tuple[Any, ...], LongBenchSample] = {}
    order = sorted((index, position) for position, ds in enumerate(datasets) for index in range(len(per_dataset[ds])))
    for index, position in order:
        sample = per_dataset[datasets[position]][index]
        for name, method in methods.items():
            unit = {
                "method": name,
                "method_options": method.identity(),
                "task": sample.dataset,
                "sample_id": sample.sample_id,
                "context_budget": context_tokens[index % len(context_tokens)] if data.is_substitute else 0,
                "max_length": int(sizes.max_length),
                "max_new_tokens_cap": int(cap) if cap else 0,
            }
            units.append(unit)
            samples[(unit["task"], unit["sample_id"], unit["context_budget"])] = sample
    return units, samples


def stored_frame(cfg: Any, store: ResultStore) -> pd.DataFrame:
    """The stored samples of the configured datasets and methods (labels from the config), computing nothing: the
    units are rebuilt without the model (the embedded samples' ids do not depend on the tokenizer's counts)."""
    methods = kv_methods(cfg)
    units, _ = _units(cfg, methods, whitespace_tokens)
    return with_current_labels(store.frame(units), methods)


def run(cfg: Any, store: ResultStore) -> pd.DataFrame:
    """Every (method, dataset, sample) not yet in ``store``; writes the tables; returns this run's rows."""
    sizes = experiment_sizes(cfg)
    max_length = int(sizes.max_length)
    cap = sizes.get("max_new_tokens_cap")
    model_spec = model_spec_from_config(cfg.model)
    if model_spec.max_context is not None and max_length > model_spec.max_context:
        raise ValueError(f"max_length {max_length} exceeds the model's {model_spec.max_context}-token window")
    data = data_spec_from_config(config_to_dict(cfg.longbench_data))
    methods = kv_methods(cfg)
    _datasets(cfg)  # unknown names fail before the model loads

    torch.manual_seed(int(cfg.seed))
    loaded = load_model(model_spec, device=cfg.scale.device)
    store.record_provenance(**_describe(loaded, data))
    all_units, samples = _units(cfg, methods, _token_counter(loaded.tokenizer))

    def compute(unit: dict[str, Any], _) -> list[dict[str, Any]]:
        sample = samples[(unit["task"], unit["sample_id"], unit["context_budget"])]
        spec = dataset_spec(sample.dataset)
        method = methods[unit["method"]]
        input_ids, truncated = build_input_ids(loaded.tokenizer, spec, sample, max_length)
        max_new = min(spec.max_new_tokens, int(cap)) if cap else spec.max_new_tokens
        result = generate(loaded, input_ids, spec, max_new, method.cache, method.options)
        row = {
            "method_label": method.label,
            "paper_method": method.paper_method,
            "category": CATEGORY_OF[sample.dataset],
            "metric": DATASET_METRIC[sample.dataset],
            "data": data.display_name,
            "data_source": data.source,
            "model": model_spec.name,
            "model_label": loaded.label,
            "length": sample.length,
            "length_bucket": length_bucket(sample.length),
            "prompt_tokens": int(input_ids.shape[-1]),
            "truncated": truncated,
            "max_new_tokens": max_new,
            "answers": json.dumps(list(sample.answers), ensure_ascii=False),
            "score": score_sample(sample.dataset, result["prediction"], sample.answers, sample.all_classes),
            **result,
        }
        return [row]

    # first: a process killed mid-run still counts its cells
    store.record_units(all_units, versioned=VERSIONED_KEYS, replicate=method_draw)
    frame = with_current_labels(store.run_units(all_units, compute, progress="longbench samples"), methods)
    if not frame.empty:
        write_tables(frame, cfg, store.directory)
    return frame


def _describe(loaded: LoadedModel, data: DataSpec) -> dict[str, Any]:
    substitutions = []
    if loaded.spec.substitutes_for:
        substitutions.append(f"{loaded.spec.display_name} instead of {loaded.spec.substitutes_for}")
    info = describe_data(data)
    if info["data_substitution"]:
        substitutions.append(info["data_substitution"])
    return {
        "description": f"model: {loaded.label}; data: {data.display_name}",
        "substitution": "; ".join(substitutions),
        "model": loaded.provenance,
        "model_label": loaded.label,
        **info,
    }


# --------------------------------------------------------------------------- tables
def _method_order(df: pd.DataFrame) -> list[str]:
    """Methods in order of appearance, the full cache (the reference) first."""
    order = list(dict.fromkeys(df["method"]))
    full = list(dict.fromkeys(df.loc[df["paper_method"] == "full", "method"]))
    return full + [m for m in order if m not in full]


def paired_samples(df: pd.DataFrame) -> pd.DataFrame:
    """Only the (task, sample) pairs that every method has scored: methods are compared on the same samples
    (an interrupted run may have finished a sample for some methods only)."""
    n_methods = df["method"].nunique()
    done = df.groupby(["task", "sample_id"])["method"].transform("nunique")
    return df[done == n_methods]


def agreement_with(df: pd.DataFrame, reference: str) -> pd.DataFrame:
    """Per method, against ``reference`` on the samples both scored: ``same_prediction_%`` (identical decoded
    text), ``delta`` (the Average difference ×100, the mean over datasets of the mean per-sample difference; NaN
    unless every dataset of the reference has a pair), ``delta_se``, its standard error from the paired per-sample
    differences: Average = mean over the D datasets, so SE² = Σ_d s_d² / n_d / D² (s_d: std of the differences on
    dataset d, n_d its samples), ``pairs``, the samples both scored, and the fewest / most of them on one dataset
    (``pairs_min`` / ``pairs_max``)."""
    keys = ["task", "sample_id"]
    ref = df[df["method"] == reference].set_index(keys)[["prediction", "score"]]
    rows = {}
    for method, group in df.groupby("method", sort=False):
        paired = group.set_index(keys)[["prediction", "score"]].merge(
            ref, left_index=True, right_index=True, how="inner", suffixes=("", "_ref"))
        diff = (paired["score"] - paired["score_ref"]) * 100
        per_task = diff.groupby(level="task").agg(["mean", "var", "count"])
        n_tasks = per_task.shape[0]
        variance = (per_task["var"].fillna(0) / per_task["count"]).sum() / n_tasks**2
        covered = n_tasks == ref.index.get_level_values("task").nunique()
        rows[method] = {
            "same_prediction_%": 100 * float((paired["prediction"].fillna("") == paired["prediction_ref"].fillna("")).mean()),
            "delta": float(per_task["mean"].mean()) if covered else float("nan"),
            "delta_se": float(np.sqrt(variance)),
            "pairs": len(paired),
            "pairs_min": int(per_task["count"].min()) if n_tasks else 0,
            "pairs_max": int(per_task["count"].max()) if n_tasks else 0,
        }
    return pd.DataFrame.from_dict(rows, orient="index")


def tables(df: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """``per_dataset`` (method × dataset, score ×100, with sample counts), ``table`` (paper form, methods with
    all 13 datasets) and ``buckets`` (method × LongBench-E length bucket, mean over datasets), all over the
    samples every method has scored; ``table`` also gives each method's difference to the full cache over all the
    samples the two have scored (``delta_all_pairs`` ± ``delta_se_all_pairs``, ``pairs``: more power where one
    method has fewer samples than the others), whose whole :func:`agreement_with` frame is ``every_pair`` (empty
    without a full-cache method)."""
    all_samples = df
    df = paired_samples(df)
    order = _method_order(df)
    labels = df.groupby("method", sort=False)["method_label"].first()
    per_dataset = df.pivot_table(index="method", columns="task", values="score", aggfunc="mean") * 100
    per_dataset = per_dataset.reindex(index=order, columns=[d for d in DATASETS if d in per_dataset.columns])
    counts = df.pivot_table(index="method", columns="task", values="score", aggfunc="count").reindex(index=order)
    complete = [m for m in order if per_dataset.loc[m].notna().all() and len(per_dataset.columns) == len(DATASETS)]
    table = summary_table(per_dataset.loc[complete]) if complete else pd.DataFrame()
    every_pair = pd.DataFrame()
    if not table.empty:
        table.insert(0, "method_label", [labels[m] for m in table.index])
        full = [m for m in complete if df.loc[df["method"] == m, "paper_method"].iloc[0] == "full"]
        if full:
            table.insert(1, "delta_vs_full", table["Average"] - table.loc[full[0], "Average"])
            fidelity = agreement_with(df, full[0])
            table.insert(2, "delta_se", fidelity["delta_se"].reindex(table.index))
            table.insert(3, "same_prediction_%", fidelity["same_prediction_%"].reindex(table.index))
            every_pair = agreement_with(all_samples, full[0]).reindex(table.index)
            table.insert(4, "delta_all_pairs", every_pair["delta"])
            table.insert(5, "delta_se_all_pairs", every_pair["delta_se"])
            table.insert(6, "pairs", every_pair["pairs"])
    by_bucket = df.groupby(["method", "task", "length_bucket"])["score"].mean().reset_index()
    buckets = by_bucket.pivot_table(index="method", columns="length_bucket", values="score", aggfunc="mean") * 100
    buckets = buckets.reindex(index=order, columns=[b for b in LENGTH_BUCKETS if b in buckets.columns])
    return {"per_dataset": per_dataset, "counts": counts, "table": table, "buckets": buckets,
            "every_pair": every_pair}


def _markdown(frame: pd.DataFrame, index_name: str) -> str:
    header = [index_name, *map(str, frame.columns)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for index, row in frame.iterrows():
        cells = [f"{v:.2f}" if isinstance(v, (float, np.floating)) else str(v) for v in row]
        lines.append("| " + " | ".join([str(index), *cells]) + " |")
    return "\n".join(lines)


def _paper_markdown() -> str:
    frame = pd.DataFrame(
        [{"model": r.model, "method": r.method, "KV bits": r.kv_bits, **r.columns, "Average": r.average,
          "Average (ICLR 2026)": r.average_iclr if r.average_iclr is not None else ""} for r in PAPER_TABLE1]
    )
    return _markdown(frame.set_index("model"), "model")


def benchmark_name(df: pd.DataFrame) -> str:
    """What the rows measure, for titles: "LongBench-E" only when every row comes from the real data."""
    if (df["data_source"] == "embedded").any():
        return "LongBench-style substitute tasks"
    return "LongBench-E"


def write_tables(df: pd.DataFrame, cfg: Any, directory: Path) -> list[Path]:
    """``summary_<model>.md`` (paper form + per-dataset + buckets, with model and data named) and beside it
    ``summary_<model>.csv`` (the paper form), ``_per_dataset.csv`` and ``_buckets.csv``; ``summary_<model>_partial``
    for a run that left out part of its grid."""
    out = tables(df)
    stem = frame_coverage(cfg, df).stem(f"summary_{df['model'].iloc[0]}")
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for key, suffix in (("table", ""), ("per_dataset", "_per_dataset"), ("buckets", "_buckets")):
        path = directory / f"{stem}{suffix}.csv"
        out[key].to_csv(path)
        paths.append(path)
    model = df["model_label"].iloc[0]
    data = df["data"].iloc[0]
    samples = int(out["counts"].min().min()) if not out["counts"].empty else 0
    lines = [
        f"# {benchmark_name(df)}, paper Table 1 form — model: {model}; data: {data}",
        "",
        f"Scores ×100, {samples}+ samples per dataset and method. Average = mean over the 13 datasets "
        "(categories weighted 2,2,2,3,2,2), as in the paper.",
        "",
    ]
    if (df["data_source"] == "embedded").any():
        lines += ["**LongBench-style substitute data, not LongBench: these are not LongBench numbers.**", ""]
    if not out["table"].empty:
        lines += ["## Categories and Average", "", _markdown(out["table"].drop(columns=list(DATASETS)), "method"), ""]
    lines += ["## Per dataset", "", _markdown(out["per_dataset"], "method"), ""]
    lines += ["## LongBench-E length buckets (mean over datasets)", "", _markdown(out["buckets"], "method"), ""]
    lines += ["## The paper (arXiv v1 Table 1; Llama-3.1-8B-Instruct / Ministral-7B-Instruct, real LongBench-E)", "",
              _paper_markdown(), ""]
    md = directory / f"{stem}.md"
    md.write_text("\n".join(lines))
    return [md, *paths]


# --------------------------------------------------------------------------- figure
def plot(df: pd.DataFrame, cfg: Any, figures_dir: Path) -> list[Path]:
    """Left: grouped bars of the six categories and the Average per method. Right: each method's Average
    minus the full cache's on the same samples, with the paired standard error (the decisive panel: the
    differences are small next to the sampling noise at quick scale)."""
    if df.empty:
        return []
    table = tables(df)["table"]
    if table.empty:
        return []
    columns = [*CATEGORIES, "Average"]
    with figure_style():
        import matplotlib.pyplot as plt

        fig, (ax, ax_delta) = plt.subplots(
            1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [3, 1.2]}, constrained_layout=True
        )
        width = 0.8 / len(table)
        x = np.arange(len(columns))
        colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
        for i, (_, row) in enumerate(table.iterrows()):
            ax.bar(x + i * width - 0.4 + width / 2, [row[c] for c in columns], width, label=row["method_label"],
                   color=colors[i % len(colors)])
        ax.set_xticks(x, columns)
        ax.set_ylabel("score (×100)")
        ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.1), frameon=False)
        if "delta_vs_full" in table:  # differences exist only when a full-cache method ran (tables())
            y = np.arange(len(table))  # each method against full on every sample the two share (paper_comparison)
            ax_delta.barh(y, table["delta_all_pairs"], xerr=table["delta_se_all_pairs"], capsize=3,
                          color=[colors[i % len(colors)] for i in range(len(table))])
            ax_delta.axvline(0, color="black", linewidth=0.8)
            labels = [textwrap.fill(f"{row['method_label']} [{int(row['pairs'])}]", 28) for _, row in table.iterrows()]
            ax_delta.set_yticks(y, labels, fontsize=7)
            ax_delta.invert_yaxis()
            ax_delta.set_xlabel("Average − full cache on every shared sample\n[pairs] (±1 paired SE)")
        else:
            ax_delta.set_visible(False)
        samples = int(df.groupby(["task", "method"]).size().min())
        provenance = df.attrs.get("provenance") or {"description": f"model: {df['model_label'].iloc[0]}; data: {df['data'].iloc[0]}"}
        fig.suptitle(figure_title(f"{benchmark_name(df)} by LongBench category ({samples}+ samples per task and "
                                  "method)", provenance), fontsize=9)
        return save_figure(fig, figures_dir, f"longbench_{df['model'].iloc[0]}", frame_coverage(cfg, df))


# --------------------------------------------------------------------------- paper comparison
_SETTING = ["max_length", "max_new_tokens_cap"]


def _largest_setting(df: pd.DataFrame) -> pd.DataFrame:
    """The rows of the (max_length, max_new_tokens_cap) setting with the most rows.

    A config's rows may come from runs with different budgets (they are unit keys, not result keys, so
    that raising a sample cap resumes); a table must not mix them.
    """
    if df.empty:
        return df
    sizes = df.groupby(_SETTING).size()
    best = sizes.idxmax()
    mask = np.logical_and.reduce([df[column] == value for column, value in zip(_SETTING, best, strict=True)])
    return df[mask]


_PAPER_KEY = {"kivi3": ("KIVI", 3), "kivi5": ("KIVI", 5), "polarquant": ("PolarQuant", 3.9),
              "turboquant_2.5": ("TurboQuant", 2.5), "turboquant_3.5": ("TurboQuant", 3.5)}


def paper_comparison(df: pd.DataFrame) -> list[dict[str, Any]]:
    """Average minus the full cache's Average, per method standing for a paper row (``paper_method``), over every
    sample the method shares with the full cache (``delta_all_pairs`` ± its paired SE): a method with few samples
    lowers its own row's power, not the others'.

    The paper's absolute Averages (``longbench.average.*``) are only compared for runs on the real
    LongBench-E; a substitute run leaves them MISSING.
    """
    df = _largest_setting(df)
    out = tables(df)
    table, pairs = out["table"], out["every_pair"]
    if table.empty or "delta_vs_full" not in table.columns:
        return []
    paper_method = df.groupby("method", sort=False)["paper_method"].first()
    real = bool((df["data_source"] != "embedded").all())
    where = f"{df['model_label'].iloc[0]}; {df['data'].iloc[0]}"
    rows = []
    for method, row in table.iterrows():
        key = paper_method[method]
        if not key:
            continue
        if key in _PAPER_KEY and np.isfinite(pairs.loc[method, "delta"]):  # NaN: a dataset without a pair
            pair = pairs.loc[method]
            samples = (f"{int(pair['pairs'])} samples paired with the full cache, "
                       f"{int(pair['pairs_min'])}-{int(pair['pairs_max'])} per dataset")
            rows.append({"id": f"longbench.avg_delta.{key}", "value": float(pair["delta"]),
                         "se": float(pair["delta_se"]),  # paired over samples: within 2 SE is not judged
                         "detail": f"{row['method_label']} Average − full cache Average, {samples} ({where})"})
        if real:
            ids = [f"longbench.average.{key}"] + (["longbench.average.turboquant_2.5.iclr"] if key == "turboquant_2.5" else [])
            rows += [{"id": i, "value": float(row["Average"]), "detail": f"{row['method_label']} ({where})"} for i in ids]
    return rows
