"""Does a fresh run of the experiments agree with the committed results? (the main job's last step)

    python scripts/agree_with_committed.py --fresh build/fresh/results [--committed results] [--check]

Both folders are read as ``scripts/compare_to_paper.py`` reads one (:func:`experiments.compare.load_runs`). Every
paper number that a fresh run and the committed run of the same experiment and config both reproduce is listed with
both values and whether they agree within the number's own tolerance, or within 2 combined standard errors where
both values carry one (:func:`experiments.compare.agreement`). Timings (Table 2) are measurements of this machine
and are expected to differ from another machine's. Writes ``<fresh>/agreement.md``; ``--check`` exits 1 when a
value disagrees.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from experiments.compare import PAPER_NUMBERS, agreement, compare, load_paper_numbers, load_runs  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fresh", type=Path, required=True, help="the results folder of the fresh run")
    parser.add_argument("--committed", type=Path, default=REPO_ROOT / "results")
    parser.add_argument("--paper-numbers", type=Path, default=PAPER_NUMBERS)
    parser.add_argument("--check", action="store_true", help="exit 1 if a value disagrees")
    args = parser.parse_args(argv)
    if not args.fresh.is_dir():
        raise SystemExit(f"{args.fresh}: no such results folder (run the experiments into it first)")
    numbers = load_paper_numbers(args.paper_numbers)
    rows = agreement(compare(numbers, load_runs(args.committed)), compare(numbers, load_runs(args.fresh)))
    disagree = [r for r in rows if not r.agrees]
    lines = [f"# Fresh run ({args.fresh}) against the committed results ({args.committed})", "",
             f"{len(rows)} values both reproduce: {len(rows) - len(disagree)} agree, {len(disagree)} differ "
             "(tolerance: the paper number's own, or 2 combined SE).", "",
             "| number | run | committed | fresh | difference | allowed | agrees |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r.id} | {r.run} | {r.committed:.6g} | {r.fresh:.6g} | {r.fresh - r.committed:+.3g} | "
              f"{r.allowed:.3g} | {'yes' if r.agrees else '**no**'} |" for r in rows]
    if not rows:
        lines.append("\nNo value of the fresh run has a committed counterpart of the same experiment and config.")
    out = args.fresh / "agreement.md"
    out.write_text("\n".join(lines) + "\n")
    print(lines[2])
    for r in disagree:
        print(f"  differs: {r.id} ({r.run}): committed {r.committed:.6g}, fresh {r.fresh:.6g}, allowed {r.allowed:.3g}")
    print(f"written {out}")
    return 1 if args.check and disagree else 0


if __name__ == "__main__":
    raise SystemExit(main())
