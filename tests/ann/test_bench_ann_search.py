"""benchmarks/bench_ann_search.py end to end at a tiny size: every index timed, the table, the figure, and a rerun
that skips the configs already saved (numbers meaningless at this size; no speed is asserted)."""

import json

import pytest

pytest.importorskip("faiss")

from benchmarks import bench_ann_search  # noqa: E402

ARGS = ["--n", "600", "--configs", "32:4", "--queries", "12", "--single", "2", "--slow-queries", "3",
        "--slow-single", "1", "--train", "600", "--rounds", "2"]


def test_bench_ann_search_writes_rows_table_and_figure_and_resumes(tmp_path):
    assert bench_ann_search.main([*ARGS, "--out", str(tmp_path)]) == 0
    saved = json.loads((tmp_path / "ann_search.json").read_text())
    rows = {row["method"]: row for row in saved["rows"]}
    assert set(rows) == set(bench_ann_search.FAST) | set(bench_ann_search.SLOW)
    assert rows["turboquant_mse"]["rounds"] == 2 and rows["pq"]["rounds"] == 1 and rows["rabitq"]["batch"] == 3
    assert rows["rabitq"]["single_queries"] == 1
    assert rows["exact"]["recall_at_1"] == 1.0
    for method in ("turboquant_mse", "turboquant_prod"):
        row = rows[method]
        assert 0 < row["batch_scan_s"] <= row["batch_profiled_s"]
        assert 0 < row["batch_rerank_s"] < row["batch_profiled_s"]
    table = (tmp_path / "ann_search.md").read_text()
    assert "turboquant_mse_1shard: one query" in table and "| random | 600 | 32 | 4 | rabitq |" in table
    assert (tmp_path / "ann_qps_recall.png").exists() and (tmp_path / "ann_qps_recall.pdf").exists()
    mtime = (tmp_path / "ann_search.json").stat().st_mtime_ns
    bench_ann_search.main([*ARGS, "--out", str(tmp_path)])  # the config is saved: nothing rebuilt
    assert (tmp_path / "ann_search.json").stat().st_mtime_ns == mtime


def test_bench_ann_search_runs_a_dataset_config(tmp_path):
    """``NAME:bits`` reads configs/dataset/NAME.yaml (real GloVe-50 here), unit-normalized, ``--real-n`` rows."""
    args = [*ARGS[2:], "--real-n", "300", "--out", str(tmp_path)]
    args[args.index("32:4")] = "glove50:4"
    assert bench_ann_search.main(args) == 0
    rows = json.loads((tmp_path / "ann_search.json").read_text())["rows"]
    assert {(r["data"], r["dim"], r["n_base"]) for r in rows} == {("glove50", 50, 300)}
    assert next(r for r in rows if r["method"] == "exact")["recall_at_1"] == 1.0
    assert "real embeddings (glove50)" in (tmp_path / "ann_search.md").read_text()
    with pytest.raises(SystemExit, match="no dataset config"):
        bench_ann_search.main([*args[:-2], "--configs", "no_such_data:4", "--out", str(tmp_path / "x")])


@pytest.mark.parametrize("text", ["1536", "1536:", ":4", "glove50:four"])
def test_a_malformed_config_is_named(text):
    with pytest.raises(SystemExit, match="expected d:bits or NAME:bits"):
        bench_ann_search.SearchConfig.parse(text)
