"""scripts/compare_to_paper.py: verdicts against the paper-numbers file, MISSING rows, --check."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import yaml

from experiments.compare import PAPER_NUMBERS, load_paper_numbers
from experiments.io import ResultStore

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "compare_to_paper.py"


def load_script():
    spec = importlib.util.spec_from_file_location("compare_to_paper", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CONFIG = {"experiment": {"name": "distortion"}, "dataset": {"name": "toy"}, "scale": {"name": "quick"}, "seed": 0}


def write_distortion_results(results_dir: Path, d_mse: dict[int, float], d_prod_times_d: dict[int, float]) -> None:
    """Rows in the distortion experiment's format (only the columns its paper_comparison reads)."""
    store = ResultStore(results_dir, "distortion", CONFIG)
    store.record_provenance(description="toy unit vectors", substitution="toy stand-in for OpenAI embeddings")
    for bits in d_mse:
        for method, column, value in (("mse", "d_mse", d_mse[bits]), ("prod", "d_prod_times_d", d_prod_times_d[bits])):
            store.save_unit({"method": method, "bits": bits},
                            [{column: value, "dim": 64, "n_base": 100, "n_queries": 10}])


def test_shipped_paper_numbers_are_valid_and_labelled() -> None:
    numbers = load_paper_numbers()
    assert numbers and all(n.version in ("arXiv v1", "ICLR 2026") for n in numbers)
    assert {n.id for n in numbers} >= {f"distortion.d_mse.b{b}" for b in range(1, 5)}


def test_a_wrong_number_fails_and_the_rest_pass(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "results"
    paper_mse = {1: 0.36, 2: 0.117, 3: 0.03, 4: 0.009}
    paper_prod = {1: 1.57, 2: 0.56, 3: 0.18, 4: 0.047}
    write_distortion_results(results, {**paper_mse, 2: 0.2}, paper_prod)  # b = 2 deliberately wrong
    script = load_script()
    assert script.main(["--results-dir", str(results)]) == 0  # without --check it only reports
    assert script.main(["--results-dir", str(results), "--check"]) == 1
    report = (results / "comparison.md").read_text()
    ids = {n.id for n in load_paper_numbers()}
    rows = {line.split("|")[1].strip(): line for line in report.splitlines() if line.startswith("| ")}
    assert ids <= set(rows), "every paper number gets a row"
    table = [line for line in report.splitlines() if line.startswith("| ") and line.split("|")[1].strip() in ids]
    assert all(len(re.split(r"(?<!\\)\|", line)) == 11 for line in table), "9 cells per row, pipes escaped"
    assert "| FAIL |" in rows["distortion.d_mse.b2"]
    assert all("| PASS |" in rows[f"distortion.d_mse.b{b}"] for b in (1, 3, 4))
    assert "| MISSING |" in rows["ip_histogram.prod_bias_z.b1"]  # that experiment has no results here
    assert "toy stand-in for OpenAI embeddings" in report
    assert "distortion.d_mse.b2" in capsys.readouterr().err


def test_known_discrepancies_do_not_fail_the_check(tmp_path: Path) -> None:
    results = tmp_path / "results"
    write_distortion_results(results, {1: 0.5}, {1: 1.57})
    entries = yaml.safe_load(PAPER_NUMBERS.read_text())["entries"]
    for entry in entries:
        if entry["id"] == "distortion.d_mse.b1":
            entry["known_discrepancy"] = "test: the printed value is known to be off"
    paper_file = tmp_path / "paper.yaml"
    paper_file.write_text(yaml.safe_dump({"entries": entries}))
    script = load_script()
    assert script.main(["--results-dir", str(results), "--paper-numbers", str(paper_file), "--check"]) == 0
    assert "FAIL (known)" in (results / "comparison.md").read_text()


def test_bad_paper_file_is_rejected(tmp_path: Path) -> None:
    bad = tmp_path / "paper.yaml"
    bad.write_text(yaml.safe_dump({"entries": [{"id": "x", "experiment": "e", "quantity": "q", "value": 1.0,
                                                "version": "arXiv v2", "source": "Table 1",
                                                "tolerance": {"relative": 0.1}}]}))
    with pytest.raises(ValueError, match="version"):
        load_paper_numbers(bad)


def test_no_results_reports_everything_missing(tmp_path: Path) -> None:
    script = load_script()
    assert script.main(["--results-dir", str(tmp_path / "empty"), "--check"]) == 0
    report = (tmp_path / "empty" / "comparison.md").read_text()
    assert "PASS 0 · FAIL 0 (0 known" in report and "No results found" in report
