"""The paper's Table 1 weighting and the LongBench prompt handling."""

from __future__ import annotations

import pandas as pd
import pytest

from experiments.longbench.prompts import DATASETS, dataset_spec, format_prompt, truncate_middle
from experiments.longbench.table import (
    CATEGORIES,
    PAPER_TABLE1,
    average_from_categories,
    category_scores,
    summary_table,
)


@pytest.mark.parametrize("row", PAPER_TABLE1, ids=lambda r: f"{r.model}-{r.method}-{r.kv_bits}")
def test_weighted_average_reproduces_paper_table1(row):
    assert average_from_categories(row.columns) == pytest.approx(row.average, abs=0.01)


def test_unweighted_mean_of_columns_does_not_reproduce_the_paper():
    # the check above can fail: the plain mean of the six columns misses by more than a point
    misses = [abs(sum(r.columns.values()) / 6 - r.average) for r in PAPER_TABLE1]
    assert min(misses) > 1.0


def test_category_scores_weights_by_dataset():
    scores = {ds: 0.0 for ds in DATASETS}
    scores.update(trec=30.0, triviaqa=60.0, samsum=90.0, lcc=13.0)
    row = category_scores(scores)
    assert row["Few-shot"] == pytest.approx(60.0)
    assert row["Code"] == pytest.approx(6.5)
    assert row["Average"] == pytest.approx((30 + 60 + 90 + 13) / 13)
    assert sum(len(m) for m in CATEGORIES.values()) == 13


def test_category_scores_needs_all_datasets():
    with pytest.raises(ValueError, match="missing"):
        category_scores({"qasper": 1.0})


def test_summary_table_layout():
    frame = pd.DataFrame([[10.0] * 13, [20.0] * 13], index=["full", "tq"], columns=list(DATASETS))
    table = summary_table(frame)
    assert list(table.columns[:7]) == [*CATEGORIES, "Average"]
    assert table.loc["tq", "Average"] == pytest.approx(20.0)


def test_truncate_middle_keeps_both_ends():
    ids = list(range(10))
    assert truncate_middle(ids, 4) == [0, 1, 8, 9]
    assert truncate_middle(ids, 5) == [0, 1, 8, 9]  # half = int(5 / 2): LongBench drops the odd token
    assert truncate_middle(ids, 10) == ids
    with pytest.raises(ValueError):
        truncate_middle(ids, 1)


def test_prompt_format_and_specs():
    prompt = format_prompt("lcc", {"context": "def f():\n    return {1: 2}\n", "input": ""})
    assert prompt == "Please complete the code given below. \ndef f():\n    return {1: 2}\nNext line of code:\n"
    assert dataset_spec("samsum").stop_at_newline and not dataset_spec("trec").use_chat_template
    assert dataset_spec("hotpotqa").use_chat_template and dataset_spec("gov_report").max_new_tokens == 512
    with pytest.raises(ValueError, match="unknown"):
        dataset_spec("lsht")
    with pytest.raises(ValueError, match="lacks"):
        format_prompt("hotpotqa", {"context": "x"})
