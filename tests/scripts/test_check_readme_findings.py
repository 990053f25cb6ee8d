"""scripts/check_readme_findings.py: every number of the README's findings must be carried by the comparison data."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("check_readme_findings", REPO / "scripts" / "check_readme_findings.py")
checker = importlib.util.module_from_spec(SPEC)
sys.modules[SPEC.name] = checker  # dataclasses look their module up
SPEC.loader.exec_module(checker)

README = """# project

Intro with 1.5 numbers that are not findings.

Findings so far (quick scale):

* D_mse = 0.3629 and 0.1172 (b = 1..4, d = 1536, 3 seeds), `experiment.sizes.quick.n_base=5000` is code;
  TurboQuant at 24.2% of the memory, 136× faster, difference −0.78 ± 0.86.

## Layout

2.5 is past the section.
"""


def write_repo(root: Path, comparison: str) -> None:
    (root / "results").mkdir(parents=True)
    (root / "figures").mkdir()
    (root / "results" / "comparison.md").write_text(comparison)
    (root / "README.md").write_text(README)


def test_numbers_are_read_from_the_findings_section_only() -> None:
    found = checker.numbers_in(checker.findings_section(README), checked_only=True)
    assert [n.text for n in found] == ["0.3629", "0.1172", "24.2%", "136×", "−0.78", "0.86"]
    assert found[4].value == -0.78 and found[2].percent
    with pytest.raises(ValueError, match="no findings section"):
        checker.findings_section("# no findings here\n")


def test_carried_numbers_pass_and_a_missing_one_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_repo(tmp_path, "| 0.36291 | 0.11716 | 0.2421 | 136.2 | -0.7812 | 0.864 |\n")
    assert checker.main(["--readme", str(tmp_path / "README.md"), "--root", str(tmp_path)]) == 0
    write_repo(tmp_path / "other", "| 0.36291 | 0.1175 | 0.2421 | 136.2 | -0.7812 | 0.864 |\n")  # 0.1172 is not carried
    assert checker.main(["--readme", str(tmp_path / "other" / "README.md"), "--root", str(tmp_path / "other")]) == 1
    err = capsys.readouterr().err
    assert "1 of 6 numbers" in err and "0.1172" in err


def test_rounding_is_at_the_printed_precision() -> None:
    number = checker.numbers_in("x 0.867 y")[0]
    assert number.carried_by(0.8671) and number.carried_by(0.8665) and not number.carried_by(0.8676)
    percent = checker.numbers_in("28.8%")[0]
    assert percent.carried_by(0.2883) and percent.carried_by(28.84) and not percent.carried_by(0.29)


def test_the_readme_findings_are_carried_by_the_committed_comparison() -> None:
    assert checker.main([]) == 0
