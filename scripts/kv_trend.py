"""The KV-cache trend (issue 18): each method's gap to the full cache against model size, from the committed runs.

    python scripts/kv_trend.py [--results results] [--figures figures]

writes ``<results>/kv_trend/summary_kv_trend.{csv,md}`` and ``<figures>/kv_trend.{png,pdf}`` (``_partial`` when a
run it read left out part of its config's grid), computing nothing (:mod:`experiments.kv_trend`); ``make check``
runs it after the comparison.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from experiments.kv_trend import plot_trend, trend_table, write_trend  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=REPO_ROOT / "results")
    parser.add_argument("--figures", type=Path, default=REPO_ROOT / "figures")
    args = parser.parse_args(argv)
    table, coverage = trend_table(args.results)
    for path in [*write_trend(table, coverage, args.results / "kv_trend"), *plot_trend(table, coverage, args.figures)]:
        print(f"written {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
