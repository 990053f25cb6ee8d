"""scripts/ann_recall_seed_spread.py: per-seed recall pivoted, mean / SD / SE computed, repeats refused."""

import sys
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import ann_recall_seed_spread as spread_script  # noqa: E402


def rows(seed, recall, method="turboquant_mse", scale="quick"):
    return pd.DataFrame([{"dataset_name": "glove50", "method": method, "bits": 2, "k": 1, "seed": seed,
                          "scale": scale, "recall": recall}])


def test_spread_over_seeds_ignores_other_methods_and_scales():
    frames = [rows(0, 0.30), rows(1, 0.34), rows(2, 0.38), rows(0, 0.9, method="pq"), rows(3, 0.1, scale="smoke")]
    table = spread_script.spread(frames, "quick", [1])
    assert len(table) == 1
    row = table.iloc[0]
    assert row["seeds"] == 3 and row["mean"] == pytest.approx(0.34)
    assert row["sd"] == pytest.approx(0.04) and row["se"] == pytest.approx(0.04 / 3 ** 0.5)


def test_a_repeated_seed_is_an_error():
    with pytest.raises(SystemExit, match="repeat"):
        spread_script.spread([rows(0, 0.3), rows(0, 0.31)], "quick", [1])
