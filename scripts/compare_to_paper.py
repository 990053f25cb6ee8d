"""Every number the paper prints beside ours, from the committed results (experiments/compare.py).

    python scripts/compare_to_paper.py            # print the summary, write results/comparison.md
    python scripts/compare_to_paper.py --check    # also exit 1 on a FAIL without a known discrepancy
    python scripts/compare_to_paper.py --stale    # exit 1 if results/comparison.md differs from a fresh report

How an experiment adds rows: configs/README.md, "Comparing with the paper".
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO_ROOT))

from experiments.compare import PAPER_NUMBERS, compare, load_paper_numbers, load_runs, render_markdown  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results-dir", type=Path, default=REPO_ROOT / "results")
    parser.add_argument("--paper-numbers", type=Path, default=PAPER_NUMBERS)
    parser.add_argument("--output", type=Path, default=None, help="default: <results-dir>/comparison.md")
    parser.add_argument("--check", action="store_true", help="exit 1 if a number FAILs without a known discrepancy")
    parser.add_argument("--stale", action="store_true", help="write nothing; exit 1 if the report on disk is not current")
    args = parser.parse_args(argv)

    numbers = load_paper_numbers(args.paper_numbers)
    runs = load_runs(args.results_dir)
    comparisons = compare(numbers, runs)
    report = render_markdown(numbers, comparisons, runs)
    output = args.output or args.results_dir / "comparison.md"
    if args.stale:
        current = output.read_text() if output.exists() else ""
        if current != report:
            print(f"{output} is stale: run `make check` and commit it", file=sys.stderr)
            return 1
        print(f"{output} is current")
        return 0
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(report)
    print("\n".join(line for line in report.splitlines() if line.startswith("- **")))
    print(f"written to {output}")
    failures = [c.paper.id for c in comparisons if c.unexplained_failure]
    if args.check and failures:
        print(f"FAIL: {', '.join(failures)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
