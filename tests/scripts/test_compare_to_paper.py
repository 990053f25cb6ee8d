"""scripts/compare_to_paper.py / experiments/compare.py: the 90 printed numbers, verdicts (tolerance, 2 SE,
one-sided bounds, known discrepancies, partial runs, substitutes), MISSING reasons, and the committed
report being current."""

from __future__ import annotations

import collections
import importlib.util
import math
import re
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir

from experiments.compare import (
    FAIL,
    FAIL_KNOWN,
    MISSING,
    NOT_REPRODUCIBLE,
    PAPER_NUMBERS,
    PARTIAL,
    PASS,
    VERSIONS,
    WITHIN_SE,
    Comparison,
    ExperimentRun,
    PaperNumber,
    Reproduced,
    Tolerance,
    _best_evidence_first,
    load_paper_numbers,
)
from experiments.coverage import CONFIG_DIR, GridCoverage
from experiments.io import ResultStore, config_to_dict

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "compare_to_paper.py"
#: The printed numbers per paper table (issue 13): 8 theory, 6 needle, 57 Table 1, 6 Fig. 5, 9 Table 2, 1 + 3.
PRINTED = {"theory": 8, "fig4": 6, "table1_llama": 43, "table1_ministral": 14, "fig5": 6, "table2": 9, "kernels": 1,
           "compression": 3}


def load_script():
    spec = importlib.util.spec_from_file_location("compare_to_paper", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def distortion_config(*overrides: str) -> dict:
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return config_to_dict(compose(config_name="config", overrides=["experiment=distortion", *overrides]))


def write_distortion_results(results_dir: Path, d_mse: dict[int, float], d_prod_times_d: dict[int, float],
                             *overrides: str) -> None:
    """Rows in the distortion experiment's format (only the columns its paper_comparison reads)."""
    store = ResultStore(results_dir, "distortion", distortion_config(*overrides))
    store.record_provenance(description="toy unit vectors", substitution="toy stand-in for OpenAI embeddings")
    for bits in d_mse:
        for method, column, value in (("mse", "d_mse", d_mse[bits]), ("prod", "d_prod_times_d", d_prod_times_d[bits])):
            store.save_unit({"method": method, "bits": bits},
                            [{column: value, "dim": 64, "n_base": 100, "n_queries": 10}])


def report_rows(report: str) -> dict[str, str]:
    """Table rows by id (a substitute row is drawn as "↳ substitute: <id>" under the number it stands for)."""
    return {line.split("|")[1].strip().removeprefix("↳ substitute: "): line
            for line in report.splitlines() if line.startswith("| ")}


PAPER_MSE = {1: 0.36, 2: 0.117, 3: 0.03, 4: 0.009}
PAPER_PROD = {1: 1.57, 2: 0.56, 3: 0.18, 4: 0.047}


def test_every_printed_number_has_a_labelled_entry() -> None:
    numbers = load_paper_numbers()
    assert len(numbers.printed) == 90
    assert collections.Counter(n.table for n in numbers.printed) == PRINTED
    assert {n.version for n in numbers.printed} == {"arXiv v1", "ICLR 2026", "Google blog"}
    assert {n.version for n in numbers} <= set(VERSIONS)
    assert {n.substitute_for for n in numbers if n.kind == "substitute"} <= {n.id for n in numbers.printed}
    unreproducible = [n for n in numbers.printed if n.table.startswith("table1")]
    assert all(n.not_reproducible for n in unreproducible), "each Table 1 cell says why it cannot be run here"


def test_a_wrong_number_fails_and_the_rest_pass(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "results"
    write_distortion_results(results, {**PAPER_MSE, 2: 0.2}, {**PAPER_PROD, 4: 0.0542})  # b = 2 wrong; b = 4 as measured
    script = load_script()
    assert script.main(["--results-dir", str(results)]) == 0  # without --check it only reports
    assert script.main(["--results-dir", str(results), "--check"]) == 1
    report = (results / "comparison.md").read_text()
    rows = report_rows(report)
    assert {n.id for n in load_paper_numbers()} <= set(rows), "every paper number gets a row"
    table = [line for id_, line in rows.items() if id_ in {n.id for n in load_paper_numbers()}]
    assert all(len(re.split(r"(?<!\\)\|", line)) == 12 for line in table), "10 cells per row, pipes escaped"
    assert "| FAIL (substitute) |" in rows["distortion.d_mse.b2"]
    assert all("| PASS (substitute) |" in rows[f"distortion.d_mse.b{b}"] for b in (1, 3, 4))
    assert "| FAIL-known (substitute) |" in rows["distortion.d_prod_times_d.b4"], "the erratum explains b = 4"
    assert "| MISSING |" in rows["ip_histogram.prod_bias_z.b1"]  # that experiment has no results here
    assert "| not reproducible here |" in rows["longbench.ministral.full.sqa"]
    assert "toy stand-in for OpenAI embeddings" in report
    assert "distortion.d_mse.b2" in capsys.readouterr().err


def test_a_reduced_run_is_partial_not_judged(tmp_path: Path) -> None:
    results = tmp_path / "results"
    write_distortion_results(results, {1: 0.5}, {1: 1.57}, "experiment.sizes.quick.n_base=100")
    script = load_script()
    assert script.main(["--results-dir", str(results), "--check"]) == 0, "a partial run is not judged"
    rows = report_rows((results / "comparison.md").read_text())
    assert "| partial, not judged |" in rows["distortion.d_mse.b1"]
    assert "experiment.sizes.quick.n_base: 100 < 20000" in rows["distortion.d_mse.b1"]


def test_fewer_cells_of_a_full_grid_are_still_judged(tmp_path: Path) -> None:
    """Dropping bit widths (the experiment's cell keys) removes rows, not the verdicts of the others."""
    results = tmp_path / "results"
    write_distortion_results(results, {1: 0.36}, {1: 1.57}, "experiment.bits=[1]")
    load_script().main(["--results-dir", str(results)])
    rows = report_rows((results / "comparison.md").read_text())
    assert "| PASS (substitute) |" in rows["distortion.d_mse.b1"]
    assert "the committed runs (distortion/" in rows["distortion.d_mse.b2"] and "| MISSING |" in rows["distortion.d_mse.b2"]


def _number(**tolerance) -> PaperNumber:
    return PaperNumber(id="x", table="fig4", experiment="needle", quantity="q", value=0.9, version="arXiv v1",
                       source="Fig. 4", tolerance=Tolerance(**tolerance))


def _value(value: float, se: float | None = None, partial: str = "") -> Reproduced:
    run = ExperimentRun("needle", "needle", "c", None, {}, {}, GridCoverage())  # type: ignore[arg-type]
    return Reproduced(value, run, se=se, partial=partial)


@pytest.mark.parametrize(
    ("tolerance", "value", "se", "verdict"),
    [
        ({"absolute": 0.05}, 0.86, None, PASS),
        ({"absolute": 0.05}, 0.80, None, FAIL),
        ({"absolute": 0.05}, 0.80, 0.06, WITHIN_SE),  # 0.1 away, 2 SE = 0.12
        ({"absolute": 0.05}, 0.60, 0.06, FAIL),
        ({"absolute": 0.05}, 0.80, math.nan, FAIL),
        ({"bound": "at_least"}, 0.95, None, PASS),
        ({"bound": "at_least"}, 0.85, 1.0, FAIL),  # a bound is not softened by an SE
        ({"bound": "at_most"}, 0.85, None, PASS),
        ({"bound": "at_most", "relative": 0.1}, 0.98, None, PASS),
        ({"bound": "at_most"}, 0.95, None, FAIL),
    ],
)
def test_verdict_rules(tolerance: dict, value: float, se: float | None, verdict: str) -> None:
    reproduced = _value(value, None if se is not None and math.isnan(se) else se)
    assert Comparison(_number(**tolerance), (reproduced,)).verdict == verdict


def test_partial_missing_and_unreproducible_verdicts() -> None:
    number = _number(absolute=0.05)
    assert Comparison(number, (_value(0.9, partial="contexts: 1 of 3"),)).verdict == PARTIAL
    assert Comparison(number).verdict == MISSING
    unreproducible = PaperNumber(**{**number.__dict__, "not_reproducible": "no such checkpoint"})
    assert Comparison(unreproducible).verdict == NOT_REPRODUCIBLE
    known = PaperNumber(**{**number.__dict__, "known_discrepancy": "other hardware"})
    assert Comparison(known, (_value(0.5),)).verdict == FAIL_KNOWN


def test_a_stand_in_setting_ranks_after_any_full_run_of_the_papers_setting() -> None:
    """A CPU time for the paper's GPU TurboQuant time (rank 1) comes after a GPU run's value, however recent."""
    def timed(value: float, updated: str, rank: int, partial: str = "") -> Reproduced:
        run = ExperimentRun("ann_indexing_time", f"src{value}", "c", None, {}, {}, GridCoverage(), updated)  # type: ignore[arg-type]
        return Reproduced(value, run, partial=partial, rank=rank)

    cpu, gpu, gpu_partial = timed(4.5, "2026-12-02", 1), timed(0.002, "2026-11-30", 0), timed(0.003, "2026-12-03", 0, "n: 1 < 3")
    assert [r.value for r in _best_evidence_first([cpu, gpu_partial, gpu])] == [0.002, 4.5, 0.003]


def test_a_run_nearer_the_papers_scale_ranks_before_a_more_recent_smaller_one() -> None:
    """A needle grid on a GPU (scale=gpu) outranks a later CPU run at scale=quick; a partial run stays last."""
    def measured(value: float, updated: str, scale: str, partial: str = "") -> Reproduced:
        config = {"scale": {"name": scale}}
        run = ExperimentRun("needle", f"src{value}", "c", None, config, {}, GridCoverage(), updated)  # type: ignore[arg-type]
        return Reproduced(value, run, partial=partial)

    quick, gpu = measured(0.9, "2026-12-06", "quick"), measured(0.6, "2026-12-01", "gpu")
    paper_partial, smoke = measured(0.5, "2026-12-07", "paper", "contexts: 1 of 8"), measured(0.1, "2026-12-08", "smoke")
    assert [r.value for r in _best_evidence_first([smoke, quick, paper_partial, gpu])] == [0.6, 0.9, 0.1, 0.5]


def _edited(tmp_path: Path, edit) -> Path:
    raw = yaml.safe_load(PAPER_NUMBERS.read_text())
    edit(raw)
    path = tmp_path / "paper.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda raw: raw["entries"][0].update(version="arXiv v2"), "version"),
        (lambda raw: raw["entries"][0].update(version="RaBitQ authors (arXiv 2604.19528)"), "printed number one of"),
        (lambda raw: raw["entries"][0].update(table="fig9"), "not under 'tables'"),
        (lambda raw: raw["entries"][0].update(tolerance={"relative": 0.0}), "two-sided tolerance"),
        (lambda raw: raw["entries"][0].update(tolerance={"bound": "sideways"}), "bound"),
        (lambda raw: raw["entries"][0].update(value="0.36"), "must be a number"),
        (lambda raw: raw["entries"].append(dict(raw["entries"][0])), "duplicate ids"),
        (lambda raw: raw["entries"][0].update(kind="substitute"), "names the printed number"),
        (lambda raw: raw["entries"][0].update({"kind": "substitute", "for": "no.such.id"}), "stand for no printed"),
        (lambda raw: raw["entries"][0].pop("source"), "lacks"),
    ],
)
def test_a_bad_paper_file_is_rejected(tmp_path: Path, edit, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_paper_numbers(_edited(tmp_path, edit))


def test_no_results_reports_everything_missing_or_unreproducible(tmp_path: Path) -> None:
    script = load_script()
    assert script.main(["--results-dir", str(tmp_path / "empty"), "--check"]) == 0
    report = (tmp_path / "empty" / "comparison.md").read_text()
    assert "90 rows: PASS 0 · FAIL 0 ·" in report and "No results found" in report
    assert "no committed results of experiment 'distortion'" in report


def test_a_corrupt_results_file_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "results" / "distortion").mkdir(parents=True)
    (tmp_path / "results" / "distortion" / "results.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match=r"distortion/results.csv: a results CSV needs"):
        load_script().main(["--results-dir", str(tmp_path / "results")])


def test_a_corrupt_run_record_names_the_file(tmp_path: Path) -> None:
    results = tmp_path / "results"
    write_distortion_results(results, {1: 0.36}, {1: 1.57})
    next((results / "distortion" / "runs").glob("*.json")).write_text("{not json")
    with pytest.raises(ValueError, match=r"runs/\w+\.json: not a readable run record"):
        load_script().main(["--results-dir", str(results)])


def test_the_committed_comparison_is_current() -> None:
    """results/comparison.md is what `make check` writes from the committed results: regenerate and commit it
    whenever results/, experiments/paper_numbers.yaml or a paper_comparison changes."""
    assert load_script().main(["--stale"]) == 0, "results/comparison.md is stale: run `make check` and commit it"


def test_a_fresh_run_agrees_with_the_committed_one_of_the_same_setting() -> None:
    from experiments.compare import agreement

    def run(config_id: str, scale: str) -> ExperimentRun:
        return ExperimentRun("needle", "needle", config_id, None, {"scale": {"name": scale}, "model": {"name": "m"}},
                             {}, GridCoverage())  # type: ignore[arg-type]

    number = _number(absolute=0.05)
    committed = [Comparison(number, (Reproduced(0.90, run("old", "quick")), Reproduced(0.5, run("o2", "gpu"))))]
    close = [Comparison(number, (Reproduced(0.93, run("new", "quick")),))]  # another config id, the same setting
    far = [Comparison(number, (Reproduced(0.80, run("new", "quick"), se=0.02),))]
    (row,) = agreement(committed, close)
    assert row.agrees and row.committed == 0.90 and row.allowed == pytest.approx(0.05)
    (row,) = agreement(committed, far)
    assert not row.agrees  # 0.10 apart; one side has no SE, so the tolerance alone decides
    both_se = [Comparison(number, (Reproduced(0.90, run("old", "quick"), se=0.05),))]
    (row,) = agreement(both_se, far)
    assert row.agrees and row.allowed == pytest.approx(2 * math.sqrt(0.05 ** 2 + 0.02 ** 2))
    assert agreement(committed, [Comparison(number, (Reproduced(0.9, run("x", "smoke")),))]) == []
