"""The paper's LongBench-E table (arXiv v1 Table 1): six category columns and the 13-dataset Average.

A category column is the mean of its datasets' scores; the Average is the mean over the 13 datasets,
i.e. the categories weighted by their sizes 2, 2, 2, 3, 2, 2 — not the mean of the six columns.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pandas as pd

from experiments.longbench.prompts import DATASETS

__all__ = [
    "CATEGORIES",
    "CATEGORY_OF",
    "category_scores",
    "average_from_categories",
    "PaperRow",
    "PAPER_TABLE1",
    "summary_table",
]

#: Table 1's columns and the LongBench-E datasets behind each.
CATEGORIES: dict[str, tuple[str, ...]] = {
    "SingleQA": ("qasper", "multifieldqa_en"),
    "MultiQA": ("hotpotqa", "2wikimqa"),
    "Summarization": ("gov_report", "multi_news"),
    "Few-shot": ("trec", "triviaqa", "samsum"),
    "Synthetic": ("passage_count", "passage_retrieval_en"),
    "Code": ("lcc", "repobench-p"),
}
CATEGORY_OF: dict[str, str] = {ds: cat for cat, members in CATEGORIES.items() for ds in members}
assert tuple(CATEGORY_OF) == DATASETS, "category map and dataset list must agree"


def category_scores(dataset_scores: Mapping[str, float]) -> dict[str, float]:
    """Each category's mean over its datasets, plus "Average" = mean over all 13 datasets.

    Every one of the 13 datasets must be present: an Average over a subset is not the paper's Average.
    """
    missing = [ds for ds in DATASETS if ds not in dataset_scores]
    if missing:
        raise ValueError(f"dataset scores missing for {missing}; the paper's Average needs all 13")
    row = {cat: sum(dataset_scores[ds] for ds in members) / len(members) for cat, members in CATEGORIES.items()}
    row["Average"] = sum(dataset_scores[ds] for ds in DATASETS) / len(DATASETS)
    return row


def average_from_categories(columns: Mapping[str, float]) -> float:
    """The 13-dataset Average recovered from the six category means: Σ_c |c|·mean_c / 13."""
    missing = [cat for cat in CATEGORIES if cat not in columns]
    if missing:
        raise ValueError(f"category columns missing: {missing}")
    total = sum(len(members) * columns[cat] for cat, members in CATEGORIES.items())
    return total / sum(len(members) for members in CATEGORIES.values())


@dataclass(frozen=True)
class PaperRow:
    """One printed row of the paper's Table 1 (arXiv v1), with the ICLR 2026 Average where it differs."""

    model: str
    method: str
    kv_bits: float
    columns: Mapping[str, float]
    average: float
    average_iclr: float | None = None


def _row(model: str, method: str, bits: float, values: tuple[float, ...], avg: float, iclr: float | None = None):
    return PaperRow(model, method, bits, dict(zip(CATEGORIES, values, strict=True)), avg, iclr)


_LLAMA = "Llama-3.1-8B-Instruct"
_MINISTRAL = "Ministral-7B-Instruct"

#: arXiv v1 Table 1, as printed (reference/paper.md). Columns in CATEGORIES order.
PAPER_TABLE1: tuple[PaperRow, ...] = (
    _row(_LLAMA, "Full cache", 16, (45.29, 45.16, 26.55, 68.38, 59.54, 46.28), 50.06),
    _row(_LLAMA, "KIVI", 3, (43.38, 37.99, 27.16, 68.38, 59.50, 44.68), 48.50),
    _row(_LLAMA, "KIVI", 5, (45.04, 45.70, 26.47, 68.57, 59.55, 46.41), 50.16),
    _row(_LLAMA, "PolarQuant", 3.9, (45.18, 44.48, 26.23, 68.25, 60.07, 45.24), 49.78),
    _row(_LLAMA, "TurboQuant", 2.5, (44.16, 44.96, 24.80, 68.01, 59.65, 45.76), 49.44, iclr=49.74),
    _row(_LLAMA, "TurboQuant", 3.5, (45.01, 45.31, 26.00, 68.63, 59.95, 46.17), 50.06),
    _row(_MINISTRAL, "Full cache", 16, (47.53, 49.06, 26.09, 66.83, 53.50, 47.90), 49.89),
    _row(_MINISTRAL, "TurboQuant", 2.5, (48.38, 49.22, 24.91, 66.69, 53.17, 46.83), 49.62),
)


def summary_table(per_dataset: pd.DataFrame) -> pd.DataFrame:
    """Table 1's form from a (method × dataset) frame of scores in percent.

    Args:
        per_dataset: index = method label, columns = the 13 dataset names (scores ×100).
    Returns:
        index = method label; columns = the six categories, "Average", then the 13 datasets.
    """
    rows = {method: category_scores(scores.to_dict()) for method, scores in per_dataset.iterrows()}
    table = pd.DataFrame.from_dict(rows, orient="index")
    return pd.concat([table, per_dataset[list(DATASETS)]], axis=1)
