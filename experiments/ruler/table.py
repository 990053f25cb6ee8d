"""RULER summary statistics: score per (task, context, method) with standard errors, and the gap to the full cache.

A method's score on one sample is first averaged over its seeds (the rotations it was run with); then over the
``n`` samples of a (task, context):

* ``mean`` and ``se`` = std / sqrt(n) of the per-sample scores (the sampling error of the task's score);
* ``seed_se`` = std of the per-seed means / sqrt(seeds) (the spread due to the quantizer's random draw; NaN
  with one seed);
* ``gap`` = mean of the per-sample differences (method - full cache) on the samples both scored, and
  ``gap_se`` = their std / sqrt(n) (the paired standard error: the same prompts, so the samples' difficulty
  cancels).

The ``average`` rows of a (context, method) are RULER's average over tasks: the mean of the task means, with
SE = sqrt(sum_t se_t^2) / T (tasks are independent samples), likewise for the gap.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

__all__ = ["AVERAGE", "per_sample", "summary_table"]

AVERAGE = "average"
_CELL = ["task", "context"]


def per_sample(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (method, task, context, sample): the score averaged over the method's seeds.

    Raises ValueError when two rows of one (task, context, sample) hold different prompts (``input_sha256``):
    scores are only compared on the same prompts."""
    prompts = df.groupby([*_CELL, "sample"])["input_sha256"].nunique()
    if (prompts > 1).any():
        bad = prompts[prompts > 1].index.tolist()[:3]
        raise ValueError(f"RULER rows of one (task, context, sample) hold different prompts: {bad}; the samples "
                         "were regenerated differently (another tokenizer or package version): rerun from scratch")
    return df.groupby(["method", *_CELL, "sample"], sort=False, as_index=False)["score"].mean()


def _std_error(values: pd.Series) -> float:
    return float(values.std(ddof=1) / math.sqrt(len(values))) if len(values) > 1 else float("nan")


def _seed_se(rows: pd.DataFrame) -> float:
    per_seed = rows.groupby(rows["method_seed"].fillna(-1))["score"].mean()
    return _std_error(per_seed)


def summary_table(df: pd.DataFrame, order: list[str], reference: str | None) -> pd.DataFrame:
    """Rows (task, context, method) in ``order`` then the ``average`` rows; columns mean, se, seeds, seed_se,
    samples, gap, gap_se (NaN without the ``reference`` method), peak_memory_ratio, bits_per_value."""
    if df.empty:
        raise ValueError("no RULER rows to summarise")
    samples = per_sample(df)
    ref = samples[samples["method"] == reference].set_index([*_CELL, "sample"])["score"]  # empty without it
    rows = []
    for (method, task, context), group in samples.groupby(["method", *_CELL], sort=False):
        raw = df[(df["method"] == method) & (df["task"] == task) & (df["context"] == context)]
        diff = (group.set_index([*_CELL, "sample"])["score"] - ref).dropna() if len(ref) else pd.Series(dtype=float)
        rows.append({
            "task": task, "context": int(context), "method": method,
            "method_label": raw["method_label"].iloc[0],
            "mean": float(group["score"].mean()), "se": _std_error(group["score"]), "samples": len(group),
            "seeds": int(raw["method_seed"].nunique()) or 1, "seed_se": _seed_se(raw),
            "gap": float(diff.mean()) if len(diff) else float("nan"),
            "gap_se": _std_error(diff) if len(diff) else float("nan"),
            "peak_memory_ratio": float(raw["peak_memory_ratio"].max()),
            "bits_per_value": float(raw["bits_per_value"].mean()),
        })
    table = pd.DataFrame(rows)
    table["method"] = pd.Categorical(table["method"], [m for m in order if m in set(table["method"])], ordered=True)
    table = table.sort_values(["context", "task", "method"], kind="stable")
    averages = []
    for (context, method), group in table.groupby(["context", "method"], sort=True, observed=True):
        n_tasks = len(group)
        averages.append({
            "task": AVERAGE, "context": int(context), "method": method, "method_label": group["method_label"].iloc[0],
            "mean": float(group["mean"].mean()), "se": float(np.sqrt((group["se"] ** 2).sum())) / n_tasks,
            "samples": int(group["samples"].sum()), "seeds": int(group["seeds"].max()),
            "seed_se": float("nan"), "gap": float(group["gap"].mean(skipna=False)),  # NaN unless every task has one
            "gap_se": float(np.sqrt((group["gap_se"] ** 2).sum(skipna=False))) / n_tasks,
            "peak_memory_ratio": float(group["peak_memory_ratio"].max()),
            "bits_per_value": float(group["bits_per_value"].mean()),
        })
    table = pd.concat([table, pd.DataFrame(averages)], ignore_index=True)
    table["method"] = table["method"].astype(str)
    return table
