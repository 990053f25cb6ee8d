"""Compare the reproduced numbers in results/ with the paper's (experiments/paper_numbers.yaml).

    python scripts/compare_to_paper.py            # print the table, write results/comparison.md
    python scripts/compare_to_paper.py --check    # also exit 1 on a FAIL not marked known_discrepancy

See experiments/compare.py for the verdicts and configs/README.md for how an experiment adds rows.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO_ROOT))

from experiments.compare import PAPER_NUMBERS, compare, latest_runs, load_paper_numbers, render_markdown  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results-dir", type=Path, default=REPO_ROOT / "results")
    parser.add_argument("--paper-numbers", type=Path, default=PAPER_NUMBERS)
    parser.add_argument("--output", type=Path, default=None, help="default: <results-dir>/comparison.md")
    parser.add_argument("--check", action="store_true", help="exit 1 if a number FAILs without a known discrepancy")
    args = parser.parse_args(argv)

    numbers = load_paper_numbers(args.paper_numbers)
    runs = latest_runs(args.results_dir)
    comparisons = compare(numbers, runs)
    report = render_markdown(comparisons, runs)
    output = args.output or args.results_dir / "comparison.md"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(report)
    print(report)
    print(f"written to {output}")
    failures = [c.paper.id for c in comparisons if c.unexplained_failure]
    if args.check and failures:
        print(f"FAIL: {', '.join(failures)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
