"""Side-by-side check of reproduced numbers against the paper's (``experiments/paper_numbers.yaml``).

Each experiment module may define ``paper_comparison(df) -> list[dict]`` returning
``{"id": <paper entry id>, "value": float, "detail": str}`` computed from its latest run's rows.
:func:`compare` matches those to the paper entries and gives each a verdict:

* PASS    |reproduced − paper| ≤ max(relative · |paper|, absolute)
* FAIL    outside that tolerance (an entry with ``known_discrepancy`` keeps FAIL but is explained)
* MISSING no reproduced value (experiment not run, or its run lacks that setting)
"""

from __future__ import annotations

import importlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from experiments.io import _ID_COLUMNS

__all__ = [
    "PAPER_NUMBERS",
    "PaperNumber",
    "Comparison",
    "ExperimentRun",
    "load_paper_numbers",
    "latest_runs",
    "compare",
    "render_markdown",
]

PAPER_NUMBERS = Path(__file__).with_name("paper_numbers.yaml")
VERSIONS = ("arXiv v1", "ICLR 2026")


@dataclass(frozen=True)
class PaperNumber:
    """One number the paper reports, with where it is printed and how close a reproduction must be."""

    id: str
    experiment: str
    quantity: str
    value: float
    version: str
    source: str
    relative_tolerance: float = 0.0
    absolute_tolerance: float = 0.0
    note: str = ""
    known_discrepancy: str = ""

    def tolerance(self) -> float:
        return max(self.relative_tolerance * abs(self.value), self.absolute_tolerance)

    def tolerance_text(self) -> str:
        parts = []
        if self.relative_tolerance:
            parts.append(f"{self.relative_tolerance:.0%}")
        if self.absolute_tolerance:
            parts.append(f"±{self.absolute_tolerance:g}")
        return " or ".join(parts) if parts else "exact"


@dataclass(frozen=True)
class ExperimentRun:
    """The latest run of one experiment found under results/: its rows and its provenance."""

    experiment: str
    config_id: str
    frame: pd.DataFrame
    provenance: dict[str, Any] = field(default_factory=dict)
    scale: str | None = None
    dataset: str | None = None


@dataclass(frozen=True)
class Comparison:
    paper: PaperNumber
    reproduced: float | None
    detail: str = ""
    config_id: str | None = None

    @property
    def difference(self) -> float | None:
        return None if self.reproduced is None else self.reproduced - self.paper.value

    @property
    def verdict(self) -> str:
        if self.reproduced is None or not math.isfinite(self.reproduced):
            return "MISSING"
        return "PASS" if abs(self.difference) <= self.paper.tolerance() else "FAIL"

    @property
    def unexplained_failure(self) -> bool:
        return self.verdict == "FAIL" and not self.paper.known_discrepancy


def load_paper_numbers(path: str | Path = PAPER_NUMBERS) -> list[PaperNumber]:
    """Parse and validate the paper-numbers YAML (unique ids, a version label, a numeric value)."""
    raw = yaml.safe_load(Path(path).read_text())
    entries = raw.get("entries") if isinstance(raw, Mapping) else None
    if not isinstance(entries, list):
        raise ValueError(f"{path}: expected a mapping with a list under 'entries'")
    numbers: list[PaperNumber] = []
    seen: set[str] = set()
    for i, entry in enumerate(entries):
        where = f"{path}: entry {i} ({entry.get('id', '?')!r})"
        for key in ("id", "experiment", "quantity", "value", "version", "source", "tolerance"):
            if key not in entry:
                raise ValueError(f"{where} lacks {key!r}")
        if entry["version"] not in VERSIONS:
            raise ValueError(f"{where}: version must be one of {VERSIONS}, got {entry['version']!r}")
        if entry["id"] in seen:
            raise ValueError(f"{where}: duplicate id")
        seen.add(entry["id"])
        tolerance = entry["tolerance"]
        if not isinstance(tolerance, Mapping) or not set(tolerance) <= {"relative", "absolute"} or not tolerance:
            raise ValueError(f"{where}: tolerance must map 'relative' and/or 'absolute' to numbers")
        numbers.append(
            PaperNumber(
                id=str(entry["id"]),
                experiment=str(entry["experiment"]),
                quantity=str(entry["quantity"]),
                value=float(entry["value"]),
                version=str(entry["version"]),
                source=str(entry["source"]),
                relative_tolerance=float(tolerance.get("relative", 0.0)),
                absolute_tolerance=float(tolerance.get("absolute", 0.0)),
                note=str(entry.get("note", "")),
                known_discrepancy=str(entry.get("known_discrepancy", "")),
            )
        )
    return numbers


def latest_runs(results_dir: str | Path) -> dict[str, ExperimentRun]:
    """For every ``results/<experiment>/``, the most recently updated run that has rows."""
    runs: dict[str, ExperimentRun] = {}
    for csv_path in sorted(Path(results_dir).glob("*/results.csv")):
        directory = csv_path.parent
        frame = pd.read_csv(csv_path, low_memory=False, dtype={c: str for c in _ID_COLUMNS})
        records = []
        for run_path in (directory / "runs").glob("*.json"):
            record = json.loads(run_path.read_text())
            if (frame["config_id"] == record["config_id"]).any():
                records.append(record)
        if not records:
            continue
        latest = max(records, key=lambda r: r["updated"])
        rows = frame[frame["config_id"] == latest["config_id"]].reset_index(drop=True)
        rows.attrs["provenance"] = latest.get("provenance", {})
        config = latest.get("config", {})
        runs[directory.name] = ExperimentRun(
            experiment=directory.name,
            config_id=latest["config_id"],
            frame=rows,
            provenance=latest.get("provenance", {}),
            scale=(config.get("scale") or {}).get("name"),
            dataset=(config.get("dataset") or {}).get("name"),
        )
    return runs


def _reproduced_values(run: ExperimentRun) -> dict[str, dict[str, Any]]:
    try:
        module = importlib.import_module(f"experiments.{run.experiment}")
    except ModuleNotFoundError:
        return {}
    produce = getattr(module, "paper_comparison", None)
    if produce is None:
        return {}
    values: dict[str, dict[str, Any]] = {}
    for item in produce(run.frame):
        if "id" not in item or "value" not in item:
            raise ValueError(f"experiments.{run.experiment}.paper_comparison returned {item!r}: needs id and value")
        values[str(item["id"])] = dict(item)
    return values


def compare(numbers: Sequence[PaperNumber], runs: Mapping[str, ExperimentRun]) -> list[Comparison]:
    """One :class:`Comparison` per paper number, in the paper file's order."""
    known_ids = {n.id for n in numbers}
    produced: dict[str, tuple[ExperimentRun, dict[str, Any]]] = {}
    for run in runs.values():
        for key, item in _reproduced_values(run).items():
            if key not in known_ids:
                raise ValueError(
                    f"experiments.{run.experiment}.paper_comparison returned id {key!r}, "
                    "which is not in the paper-numbers file"
                )
            produced[key] = (run, item)
    comparisons = []
    for number in numbers:
        if number.id in produced:
            run, item = produced[number.id]
            comparisons.append(
                Comparison(number, float(item["value"]), str(item.get("detail", "")), run.config_id)
            )
        else:
            comparisons.append(Comparison(number, None))
    return comparisons


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell (a literal pipe would split the cell)."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def _fmt(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:.4g}"


def render_markdown(comparisons: Sequence[Comparison], runs: Mapping[str, ExperimentRun]) -> str:
    """The comparison report: the side-by-side table, the notes, and the substitutions made."""
    counts = {v: sum(c.verdict == v for c in comparisons) for v in ("PASS", "FAIL", "MISSING")}
    known = sum(c.verdict == "FAIL" and bool(c.paper.known_discrepancy) for c in comparisons)
    lines = [
        "# Reproduced numbers vs the paper",
        "",
        f"PASS {counts['PASS']} · FAIL {counts['FAIL']} ({known} known, explained in the notes) · "
        f"MISSING {counts['MISSING']} "
        "(PASS: |reproduced − paper| ≤ tolerance; tolerance = max(relative·|paper|, absolute)).",
        "",
        "| id | quantity | paper | version | source | reproduced | difference | tolerance | verdict |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in comparisons:
        verdict = c.verdict + (" (known)" if c.verdict == "FAIL" and c.paper.known_discrepancy else "")
        lines.append(
            f"| {c.paper.id} | {_cell(c.paper.quantity)} | {c.paper.value:g} | {c.paper.version} | {_cell(c.paper.source)} "
            f"| {_fmt(c.reproduced)} | {_fmt(c.difference)} | {c.paper.tolerance_text()} | {verdict} |"
        )
    notes = [c for c in comparisons if c.paper.note or c.paper.known_discrepancy or c.detail]
    if notes:
        lines += ["", "## Notes", ""]
        for c in notes:
            text = "; ".join(t for t in (c.detail, c.paper.note) if t)
            if c.paper.known_discrepancy:
                text += ("; " if text else "") + f"known discrepancy: {c.paper.known_discrepancy}"
            lines.append(f"- `{c.paper.id}`: {text}")
    lines += ["", "## Runs used and substitutions", ""]
    if not runs:
        lines.append("No results found: run the experiments first (`make figures`).")
    else:
        lines += ["| experiment | config_id | scale | data / model used | substitution |", "|---|---|---|---|---|"]
        for run in runs.values():
            used = run.provenance.get("description") or run.provenance.get("dataset") or run.dataset or "—"
            substitution = run.provenance.get("substitution") or "none"
            lines.append(f"| {run.experiment} | {run.config_id} | {run.scale} | {_cell(used)} | {_cell(substitution)} |")
    return "\n".join(lines) + "\n"
