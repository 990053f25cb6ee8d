"""Check that every number in the README's findings is carried by the committed comparison data.

    python scripts/check_readme_findings.py                 # exit 1 and list the numbers nothing carries
    python scripts/check_readme_findings.py --readme X.md   # another file's findings section

The findings section runs from the line starting with ``Findings`` to the next ``## `` heading. A number
there (one with a decimal point, or followed by ``×`` / ``%``; inline code is skipped) is *carried* when a
number in the comparison data rounds to it at the README's printed precision (a percentage may also be
a fraction: 24.2% is carried by 0.2421). The comparison data are the generated reports of the committed
results: ``results/comparison.md``, every ``results/**/*.md`` and ``figures/**/*.md``, and the benchmark records
``benchmarks/*.md`` (measured times with the command that made them).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]

_NUMBER = re.compile(r"(?<![\w.])([-−]?)(\d[\d,]*(?:\.\d+)?)(\s?[×%])?(?![\w.]*\d)")
_CODE = re.compile(r"`[^`]*`")


@dataclass(frozen=True)
class PrintedNumber:
    """One number as the README prints it."""

    text: str
    value: float
    decimals: int
    percent: bool
    context: str

    def carried_by(self, value: float) -> bool:
        half_unit = 0.5 * 10.0 ** -self.decimals + 1e-12
        candidates = (value, 100 * value) if self.percent else (value,)
        return any(abs(c - self.value) <= half_unit for c in candidates)


def findings_section(text: str) -> str:
    """The README's findings: from the line starting with "Findings" to the next level-2 heading."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("Findings")), None)
    if start is None:
        raise ValueError("no findings section: no line starts with 'Findings'")
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    return "\n".join(lines[start:end])


def numbers_in(text: str, checked_only: bool = False) -> list[PrintedNumber]:
    """The numbers of ``text`` (outside inline code); ``checked_only``: those with a decimal point or a
    × / % suffix (counts such as "3 seeds" or "d = 1536" are labels, not findings)."""
    found = []
    for line in text.splitlines():
        plain = _CODE.sub(" ", line)
        for match in _NUMBER.finditer(plain):
            sign, digits, suffix = match.group(1), match.group(2).replace(",", ""), (match.group(3) or "").strip()
            if checked_only and "." not in digits and not suffix:
                continue
            decimals = len(digits.split(".")[1]) if "." in digits else 0
            value = float(digits) * (-1 if sign else 1)
            start = max(0, match.start() - 40)
            found.append(PrintedNumber(match.group(0).strip(), value, decimals, suffix == "%",
                                       plain[start:match.end() + 20].strip()))
    return found


def comparison_files(root: Path = REPO_ROOT) -> list[Path]:
    """The generated reports of the committed results."""
    return sorted({root / "results" / "comparison.md", *(root / "results").rglob("*.md"), *(root / "figures").rglob("*.md"),
                   *(root / "benchmarks").glob("*.md")})


def carried_values(paths: Iterable[Path]) -> list[float]:
    values = []
    for path in paths:
        if path.exists():
            values += [n.value for n in numbers_in(path.read_text())]
    return values


def uncarried(readme: str, values: Sequence[float]) -> list[PrintedNumber]:
    """The findings' numbers no value carries."""
    return [n for n in numbers_in(findings_section(readme), checked_only=True) if not any(n.carried_by(v) for v in values)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--readme", type=Path, default=REPO_ROOT / "README.md")
    parser.add_argument("--root", type=Path, default=REPO_ROOT, help="repository whose results/ and figures/ are read")
    args = parser.parse_args(argv)
    missing = uncarried(args.readme.read_text(), carried_values(comparison_files(args.root)))
    checked = numbers_in(findings_section(args.readme.read_text()), checked_only=True)
    if missing:
        print(f"{len(missing)} of {len(checked)} numbers in the findings of {args.readme} are carried by no "
              "committed comparison data:", file=sys.stderr)
        for number in missing:
            print(f"  {number.text:>10}  …{number.context}…", file=sys.stderr)
        return 1
    print(f"all {len(checked)} numbers in the findings of {args.readme} are carried by the comparison data")
    return 0


if __name__ == "__main__":
    sys.exit(main())
