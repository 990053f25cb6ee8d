"""Every number the paper prints, beside ours: the verdicts of ``results/comparison.md``.

Inputs, both committed: ``experiments/paper_numbers.yaml`` (the paper's numbers, one table per paper
figure / table, with tolerances and their reasons) and ``results/<dir>/results.csv`` with each run's
record (``runs/<config_id>.json``, or ``config.json`` for a directory copied from another machine, such as
``results/kernels/``). Nothing is recomputed: each experiment module's ``paper_comparison(df)`` turns a
run's rows into ``{"id", "value", "detail"}`` items (optionally ``"se"``, the standard error of the value,
``"substitute"``, what stands in for the paper's setting, and ``"rank"``, 1 for a stand-in measurement that any
rank-0 value of another run outranks, e.g. TurboQuant timed on a CPU for the paper's GPU time); an experiment's ``comparisons`` in the
paper-numbers file name further ``module:function`` s of the same kind that read its rows (a dispute measured
on another experiment's runs, e.g. the rotation on needle scores).

Verdict of one reproduced value against the paper's, in this order:

* ``partial, not judged``  the run left out part of its config's grid (:mod:`experiments.coverage`), other
  than the cells the paper number does not depend on (the experiment's ``cell_keys``);
* ``PASS``                 inside the tolerance: ``|ours - paper| <= max(relative * |paper|, absolute)``, or
  on the right side of a one-sided bound (``at_least`` / ``at_most``);
* ``not judged (within 2 SE)``  outside the tolerance but within two standard errors of the paper's value;
* ``FAIL-known``           outside, with a known discrepancy (an erratum, other hardware) explained in the notes;
* ``FAIL``                 outside.

A verdict on a run that records a substitution (another model, data set or dimension) says
``(substitute)``. A paper number without a reproduced value is ``not reproducible here`` when its
entry names why (and its substitute rows follow it), else ``MISSING`` with the reason.
"""

from __future__ import annotations

import importlib
import json
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from experiments.coverage import GridCoverage, frame_coverage, record_config
from experiments.io import _ID_COLUMNS, recorded_unit_ids

__all__ = [
    "PAPER_NUMBERS",
    "VERSIONS",
    "Tolerance",
    "PaperTable",
    "PaperNumber",
    "PaperNumbers",
    "ExperimentRun",
    "Reproduced",
    "Comparison",
    "load_paper_numbers",
    "load_runs",
    "compare",
    "Agreement",
    "agreement",
    "render_markdown",
]

PAPER_NUMBERS = Path(__file__).with_name("paper_numbers.yaml")
#: Where a number is printed: the paper's two versions, Google's blog, and the groups whose claims checks test.
VERSIONS = ("arXiv v1", "ICLR 2026", "Google blog", "RaBitQ authors (arXiv 2604.19528)",
            "DRIVE/EDEN authors (arXiv 2604.18555)")
KINDS = ("printed", "substitute", "check")
BOUNDS = ("two-sided", "at_least", "at_most")

PASS, FAIL, FAIL_KNOWN = "PASS", "FAIL", "FAIL-known"
WITHIN_SE = "not judged (within 2 SE)"
PARTIAL = "partial, not judged"
NOT_REPRODUCIBLE = "not reproducible here"
MISSING = "MISSING"
VERDICTS = (PASS, FAIL, FAIL_KNOWN, WITHIN_SE, PARTIAL, NOT_REPRODUCIBLE, MISSING)


@dataclass(frozen=True)
class Tolerance:
    """How close ours must be: ``max(relative * |paper|, absolute)`` either side, or a one-sided bound."""

    relative: float = 0.0
    absolute: float = 0.0
    bound: str = "two-sided"
    why: str = ""

    def slack(self, paper: float) -> float:
        return max(self.relative * abs(paper), self.absolute)

    def admits(self, ours: float, paper: float) -> bool:
        if self.bound == "at_least":
            return ours >= paper - self.slack(paper)
        if self.bound == "at_most":
            return ours <= paper + self.slack(paper)
        return abs(ours - paper) <= self.slack(paper)

    def text(self) -> str:
        parts = [f"{self.relative:.0%}"] if self.relative else []
        parts += [f"±{self.absolute:g}"] if self.absolute else []
        spread = " or ".join(parts)
        if self.bound == "two-sided":
            return spread or "exact"
        return {"at_least": "≥ paper", "at_most": "≤ paper"}[self.bound] + (f" ({spread})" if spread else "")


@dataclass(frozen=True)
class PaperTable:
    """One paper figure or table: a section of the report."""

    id: str
    title: str
    tolerance_why: str


@dataclass(frozen=True)
class PaperNumber:
    """One number the paper prints (``kind="printed"``), or a row judged beside them: a ``substitute`` for a
    printed number that cannot be reproduced here, or a ``check`` of a claim with no printed number."""

    id: str
    table: str
    experiment: str
    quantity: str
    value: float
    version: str
    source: str
    tolerance: Tolerance
    kind: str = "printed"
    substitute_for: str = ""
    not_reproducible: str = ""
    erratum: str = ""
    known_discrepancy: str = ""
    note: str = ""


@dataclass(frozen=True)
class PaperNumbers:
    """The parsed paper-numbers file: tables in report order, numbers in file order, per-experiment settings."""

    tables: tuple[PaperTable, ...]
    numbers: tuple[PaperNumber, ...]
    cell_keys: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    missing: Mapping[str, str] = field(default_factory=dict)
    comparisons: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # extra "module:function" producers

    def __iter__(self) -> Iterator[PaperNumber]:
        return iter(self.numbers)

    @property
    def printed(self) -> tuple[PaperNumber, ...]:
        return tuple(n for n in self.numbers if n.kind == "printed")


def _require(entry: Mapping[str, Any], keys: Sequence[str], where: str) -> None:
    missing = [key for key in keys if key not in entry]
    if missing:
        raise ValueError(f"{where} lacks {missing}")


def _tolerance(raw: Any, where: str) -> Tolerance:
    if not isinstance(raw, Mapping) or not set(raw) <= {"relative", "absolute", "bound", "why"}:
        raise ValueError(f"{where}: tolerance must map relative / absolute / bound / why, got {raw!r}")
    tolerance = Tolerance(float(raw.get("relative", 0.0)), float(raw.get("absolute", 0.0)),
                          str(raw.get("bound", "two-sided")), str(raw.get("why", "")))
    if tolerance.bound not in BOUNDS:
        raise ValueError(f"{where}: tolerance bound must be one of {BOUNDS}, got {tolerance.bound!r}")
    if tolerance.bound == "two-sided" and not (tolerance.relative or tolerance.absolute):
        raise ValueError(f"{where}: a two-sided tolerance needs a relative and/or absolute width")
    return tolerance


def load_paper_numbers(path: str | Path = PAPER_NUMBERS) -> PaperNumbers:
    """Parse and validate the paper-numbers YAML: unique ids, known tables / versions / kinds, numeric
    values, substitutes pointing at printed numbers."""
    raw = yaml.safe_load(Path(path).read_text())
    if not isinstance(raw, Mapping) or not isinstance(raw.get("entries"), list) or not isinstance(raw.get("tables"), list):
        raise ValueError(f"{path}: expected a mapping with lists under 'tables' and 'entries'")
    tables = []
    for i, table in enumerate(raw["tables"]):
        _require(table, ("id", "title", "tolerance_why"), f"{path}: table {i}")
        tables.append(PaperTable(str(table["id"]), str(table["title"]), str(table["tolerance_why"])))
    table_ids = {t.id for t in tables}
    numbers: list[PaperNumber] = []
    for i, entry in enumerate(raw["entries"]):
        where = f"{path}: entry {i} ({entry.get('id', '?')!r})"
        _require(entry, ("id", "table", "experiment", "quantity", "value", "version", "source", "tolerance"), where)
        if entry["version"] not in VERSIONS or (entry.get("kind", "printed") == "printed" and entry["version"] not in VERSIONS[:3]):
            raise ValueError(f"{where}: version must be one of {VERSIONS} (a printed number one of the first three), "
                             f"got {entry['version']!r}")
        if entry["table"] not in table_ids:
            raise ValueError(f"{where}: table {entry['table']!r} is not under 'tables'")
        kind = str(entry.get("kind", "printed"))
        if kind not in KINDS:
            raise ValueError(f"{where}: kind must be one of {KINDS}, got {kind!r}")
        if (kind == "substitute") != ("for" in entry):
            raise ValueError(f"{where}: a substitute row names the printed number it stands for ('for'), and only it")
        if not isinstance(entry["value"], (int, float)) or isinstance(entry["value"], bool):
            raise ValueError(f"{where}: value must be a number, got {entry['value']!r}")
        numbers.append(PaperNumber(
            id=str(entry["id"]), table=str(entry["table"]), experiment=str(entry["experiment"]),
            quantity=str(entry["quantity"]), value=float(entry["value"]), version=str(entry["version"]),
            source=str(entry["source"]), tolerance=_tolerance(entry["tolerance"], where), kind=kind,
            substitute_for=str(entry.get("for", "")), not_reproducible=str(entry.get("not_reproducible", "")),
            erratum=str(entry.get("erratum", "")), known_discrepancy=str(entry.get("known_discrepancy", "")),
            note=str(entry.get("note", "")),
        ))
    ids = [n.id for n in numbers]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise ValueError(f"{path}: duplicate ids {duplicates}")
    printed = {n.id for n in numbers if n.kind == "printed"}
    dangling = [n.id for n in numbers if n.kind == "substitute" and n.substitute_for not in printed]
    if dangling:
        raise ValueError(f"{path}: substitute rows {dangling} stand for no printed number")
    experiments = raw.get("experiments") or {}
    return PaperNumbers(
        tables=tuple(tables), numbers=tuple(numbers),
        cell_keys={name: tuple(spec.get("cell_keys", ())) for name, spec in experiments.items()},
        missing={name: str(spec["missing"]) for name, spec in experiments.items() if "missing" in spec},
        comparisons={name: tuple(str(c) for c in spec.get("comparisons", ())) for name, spec in experiments.items()},
    )


@dataclass(frozen=True)
class ExperimentRun:
    """One run found under ``results/<source>/``: its rows, its resolved config and provenance, its coverage."""

    experiment: str
    source: str
    config_id: str
    frame: pd.DataFrame
    config: Mapping[str, Any]
    provenance: Mapping[str, Any]
    coverage: GridCoverage
    updated: str = ""

    @property
    def scale(self) -> str:
        return str((self.config.get("scale") or {}).get("name", ""))

    @property
    def label(self) -> str:
        return f"{self.source}/{self.config_id}"


def _run(source: str, frame: pd.DataFrame, record: Mapping[str, Any]) -> ExperimentRun:
    config = record_config(record)
    rows = frame[frame["config_id"] == record["config_id"]].reset_index(drop=True)
    provenance = dict(record.get("provenance") or {})
    rows.attrs["provenance"] = provenance
    rows.attrs["config_id"] = record["config_id"]
    asked = recorded_unit_ids(provenance)
    if asked is not None:  # the cells the run was asked for: one without rows makes the run partial
        asked = set(asked)
        rows.attrs["units"] = {"asked": len(asked), "missing": len(asked - set(rows["unit_id"]))}
    return ExperimentRun(
        experiment=str((config.get("experiment") or {}).get("name") or rows["experiment"].iloc[0]),
        source=source, config_id=str(record["config_id"]), frame=rows, config=config, provenance=provenance,
        coverage=frame_coverage(config, rows), updated=str(record.get("updated", "")),
    )


def _read_json(path: Path) -> dict[str, Any]:
    try:
        record = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: not a readable run record ({err})") from err
    if not isinstance(record, dict):
        raise ValueError(f"{path}: a run record is a JSON object, got {type(record).__name__}")
    return record


def load_runs(results_dir: str | Path) -> list[ExperimentRun]:
    """Every run with rows under ``results_dir``: per ``<dir>/results.csv``, the runs its ``runs/*.json``
    records name, or, for a directory without run records, the one run its ``config.json`` describes."""
    runs = []
    for csv_path in sorted(Path(results_dir).glob("*/results.csv")):
        directory = csv_path.parent
        try:
            frame = pd.read_csv(csv_path, low_memory=False, dtype={c: str for c in _ID_COLUMNS},
                                float_precision="round_trip")  # the store's parser (see experiments.io._number)
        except (pd.errors.ParserError, UnicodeDecodeError) as err:
            raise ValueError(f"{csv_path}: not a readable results CSV ({err})") from err
        if "config_id" not in frame or "experiment" not in frame:
            raise ValueError(f"{csv_path}: a results CSV needs 'experiment' and 'config_id' columns")
        present = set(frame["config_id"])
        records = [_read_json(p) for p in sorted((directory / "runs").glob("*.json"))]
        records = [r for r in records if r.get("config_id") in present]
        if not records and (directory / "config.json").exists():
            if len(present) != 1:
                raise ValueError(f"{csv_path}: rows of {len(present)} configs but one config.json and no runs/ records")
            records = [{"config_id": next(iter(present)), "config": _read_json(directory / "config.json")}]
        runs += [_run(directory.name, frame, record) for record in records]
    return runs


@dataclass(frozen=True)
class Reproduced:
    """Our value for one paper number from one run."""

    value: float
    run: ExperimentRun
    detail: str = ""
    se: float | None = None
    substitute: str = ""
    partial: str = ""  # the reductions of the run this value depends on ("" when it covers the grid)
    rank: int = 0  # 1: a stand-in setting (e.g. a CPU time for the paper's GPU time); any rank-0 value comes first


@dataclass(frozen=True)
class Comparison:
    """A paper number and every value the committed runs give for it (best evidence first)."""

    paper: PaperNumber
    values: tuple[Reproduced, ...] = ()
    missing_reason: str = ""

    @property
    def primary(self) -> Reproduced | None:
        return self.values[0] if self.values else None

    def verdict_of(self, reproduced: Reproduced | None) -> str:
        if reproduced is None or not math.isfinite(reproduced.value):
            return NOT_REPRODUCIBLE if self.paper.not_reproducible else MISSING
        if reproduced.partial:
            return PARTIAL
        tolerance, paper = self.paper.tolerance, self.paper.value
        if tolerance.admits(reproduced.value, paper):
            return PASS
        se = reproduced.se
        if tolerance.bound == "two-sided" and se is not None and math.isfinite(se) and abs(reproduced.value - paper) <= 2 * se:
            return WITHIN_SE
        return FAIL_KNOWN if self.paper.known_discrepancy else FAIL

    @property
    def verdict(self) -> str:
        return self.verdict_of(self.primary)

    @property
    def on_substitute(self) -> bool:
        return bool(self.primary and self.primary.substitute)

    @property
    def unexplained_failure(self) -> bool:
        return self.verdict == FAIL


def _path_pattern(key: str) -> re.Pattern[str]:
    """A dotted config path pattern: ``*`` is one path segment, ``**`` any number of them."""
    parts = (r"[^.]+" if part == "*" else ".+" if part == "**" else re.escape(part) for part in key.split("."))
    return re.compile(r"\.".join(parts) + "$")


def _partial(run: ExperimentRun, cell_keys: Sequence[str]) -> str:
    """The run's reductions that matter for its paper numbers (those outside the experiment's cell keys)."""
    patterns = [_path_pattern(key) for key in cell_keys]
    relevant = [r for r in run.coverage.reduced if not any(p.match(r.path) for p in patterns)]
    return "; ".join(map(str, relevant))


def _producers(experiment: str, extra: Sequence[str]) -> list[tuple[str, Any]]:
    """``(name, function)`` of each producer of an experiment's verdict items: ``experiments.<experiment>``'s
    ``paper_comparison`` (when the module has one) and each ``module:function`` in ``extra``."""
    producers = []
    try:
        module = importlib.import_module(f"experiments.{experiment}")
    except ModuleNotFoundError as err:
        if err.name != f"experiments.{experiment}":
            raise
    else:
        if hasattr(module, "paper_comparison"):
            producers.append((f"experiments.{experiment}.paper_comparison", module.paper_comparison))
    for spec in extra:
        module_name, _, function = spec.partition(":")
        produce = getattr(importlib.import_module(module_name), function, None) if function else None
        if not callable(produce):
            raise ValueError(f"comparisons of experiment {experiment!r}: {spec!r} is not a module:function")
        producers.append((spec, produce))
    return producers


def _reproduced_values(run: ExperimentRun, known_ids: set[str], cell_keys: Sequence[str],
                       extra: Sequence[str] = ()) -> list[tuple[str, Reproduced]]:
    producers = _producers(run.experiment, extra)
    if not producers:
        return []
    partial = _partial(run, cell_keys)
    substitution = str(run.provenance.get("substitution") or "")
    out = []
    items = [(name, item) for name, produce in producers for item in produce(run.frame)]
    for name, item in items:
        if "id" not in item or "value" not in item:
            raise ValueError(f"{name} returned {item!r}: needs id and value")
        if item["id"] not in known_ids:
            raise ValueError(f"{name} returned id {item['id']!r}, which is not in the paper-numbers file")
        se = item.get("se")
        out.append((str(item["id"]), Reproduced(
            value=float(item["value"]), run=run, detail=str(item.get("detail", "")),
            se=None if se is None or not math.isfinite(float(se)) else float(se),
            substitute=str(item.get("substitute") or substitution), partial=partial, rank=int(item.get("rank", 0)),
        )))
    return out


#: scales (``configs/scale/``) from the paper's protocol down to the code path: a run nearer the paper's sizes is
#: better evidence for its number than a more recent run at smaller sizes (e.g. the needle at 4K-32K on a GPU over
#: SmolLM2 at 1K-2K on a CPU); a scale not named here ranks after these
SCALE_ORDER = ("paper", "gpu", "quick", "smoke")


def _scale_rank(run: ExperimentRun) -> int:
    return SCALE_ORDER.index(run.scale) if run.scale in SCALE_ORDER else len(SCALE_ORDER)


def _best_evidence_first(values: Sequence[Reproduced]) -> tuple[Reproduced, ...]:
    """Full runs first, then rank-0 values, then the scale nearest the paper's (:data:`SCALE_ORDER`), then the
    most recently updated, then by run label (stable sorts, last key first)."""
    ordered = sorted(values, key=lambda r: r.run.label)
    ordered = sorted(ordered, key=lambda r: r.run.updated, reverse=True)
    return tuple(sorted(ordered, key=lambda r: (bool(r.partial), r.rank, _scale_rank(r.run))))


def compare(numbers: PaperNumbers, runs: Sequence[ExperimentRun]) -> list[Comparison]:
    """One :class:`Comparison` per entry of the paper-numbers file, in its order."""
    known = {n.id for n in numbers.numbers}
    found: dict[str, list[Reproduced]] = {}
    for run in runs:
        for key, reproduced in _reproduced_values(run, known, numbers.cell_keys.get(run.experiment, ()),
                                                  numbers.comparisons.get(run.experiment, ())):
            found.setdefault(key, []).append(reproduced)
    ran = {run.experiment for run in runs}
    comparisons = []
    for number in numbers.numbers:
        values = _best_evidence_first(found.get(number.id, []))
        reason = ""
        if not values:
            if number.experiment not in ran:
                reason = numbers.missing.get(number.experiment) or f"no committed results of experiment {number.experiment!r}"
            else:
                labels = ", ".join(sorted(r.label for r in runs if r.experiment == number.experiment))
                reason = f"the committed runs ({labels}) do not cover this setting"
        comparisons.append(Comparison(number, values, reason))
    return comparisons


@dataclass(frozen=True)
class Agreement:
    """One paper number's value from a fresh run beside the committed run of the same setting."""

    id: str
    run: str
    committed: float
    fresh: float
    allowed: float  # the paper number's own tolerance around our value, widened to 2 combined SE when known
    agrees: bool


def _setting(run: ExperimentRun) -> tuple[str, str, str, str]:
    """What makes two runs the same measurement: experiment, scale, data set and model (a config that gained
    an unrelated key, e.g. a new scale, has a new config id but measures the same thing)."""
    def name(group: str) -> str:
        node = run.config.get(group)
        return str(node.get("name", "")) if isinstance(node, Mapping) else ""
    return run.experiment, run.scale, name("dataset"), name("model")


def agreement(committed: Sequence[Comparison], fresh: Sequence[Comparison]) -> list[Agreement]:
    """Every value a fresh run reproduces that a committed run of the same setting (:func:`_setting`) reproduces too,
    with whether they agree: ``|fresh - committed| <= max(tolerance slack at the paper's value,
    2 sqrt(se_fresh^2 + se_committed^2))``. A verdict that a rerun would change is not a verdict."""
    stored = {(c.paper.id, *_setting(r.run)): r for c in committed for r in c.values}
    out = []
    for comparison in fresh:
        for value in comparison.values:
            old = stored.get((comparison.paper.id, *_setting(value.run)))
            if old is None or not (math.isfinite(old.value) and math.isfinite(value.value)):
                continue
            ses = [se for se in (old.se, value.se) if se is not None and math.isfinite(se)]
            allowed = max(comparison.paper.tolerance.slack(comparison.paper.value),
                          2 * math.sqrt(sum(se * se for se in ses)) if len(ses) == 2 else 0.0)
            out.append(Agreement(comparison.paper.id, value.run.label, old.value, value.value, allowed,
                                 abs(value.value - old.value) <= allowed))
    return out


# --------------------------------------------------------------------------- report
def _cell(text: Any) -> str:
    """Text safe inside a Markdown table cell (a literal pipe would split the cell)."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def _fmt(value: float | None) -> str:
    return "—" if value is None or not math.isfinite(value) else f"{value:.4g}"


def _verdict_text(comparison: Comparison, reproduced: Reproduced | None) -> str:
    verdict = comparison.verdict_of(reproduced)
    return verdict + (" (substitute)" if reproduced and reproduced.substitute and verdict != PARTIAL else "")


def _evidence(comparison: Comparison, reproduced: Reproduced | None) -> str:
    if reproduced is None:
        return comparison.missing_reason or ""
    parts = [reproduced.detail] if reproduced.detail else []
    parts.append(f"run {reproduced.run.label} ({reproduced.run.scale or 'no scale'})")
    if reproduced.partial:
        parts.append(f"partial run: {reproduced.partial}")
    return "; ".join(parts)


def _row(comparison: Comparison, reproduced: Reproduced | None, label: str) -> str:
    paper = comparison.paper
    ours = None if reproduced is None else reproduced.value
    difference = None if ours is None else ours - paper.value
    se = None if reproduced is None else reproduced.se
    return (f"| {_cell(label)} | {_cell(paper.quantity)} | {paper.version} | {paper.value:g} | {_fmt(ours)} | "
            f"{_fmt(se)} | {_fmt(difference)} | {_cell(paper.tolerance.text())} | {_verdict_text(comparison, reproduced)} "
            f"| {_cell(_evidence(comparison, reproduced))} |")


def _summary(comparisons: Sequence[Comparison], kind: str) -> str:
    chosen = [c for c in comparisons if c.paper.kind == kind]
    counts = {v: sum(c.verdict == v for c in chosen) for v in VERDICTS}
    text = " · ".join(f"{v} {counts[v]}" for v in VERDICTS if counts[v] or v in (PASS, FAIL, MISSING))
    substitutes = sum(c.on_substitute for c in chosen)
    return f"{len(chosen)} rows: {text}" + (f" ({substitutes} of the verdicts on a substitute)" if substitutes else "")


def render_markdown(numbers: PaperNumbers, comparisons: Sequence[Comparison], runs: Sequence[ExperimentRun]) -> str:
    """The report: summary, one table per paper figure / table, the notes, and the runs read."""
    lines = [
        "# Reproduced numbers vs the paper",
        "",
        "Generated by `make check` (`scripts/compare_to_paper.py`) from the committed results alone; "
        "`experiments/compare.py` defines the verdicts, `experiments/paper_numbers.yaml` the paper's numbers.",
        "",
        f"- **Printed numbers** (arXiv v1, ICLR 2026, Google's blog): {_summary(comparisons, 'printed')}",
        f"- **Substitute rows** (the closest quantity reproducible here, beside the printed row): "
        f"{_summary(comparisons, 'substitute')}",
        f"- **Checks** (claims without a printed number): {_summary(comparisons, 'check')}",
        "",
        "PASS: |ours − paper| ≤ tolerance = max(relative·|paper|, absolute), or on the right side of a one-sided "
        "bound. Within 2 standard errors (SE) of the paper but outside the tolerance: not judged. "
        "A run that left out part of its config's grid: partial, not judged. (substitute): the run used another "
        "model, data set or dimension than the paper (named in the runs table).",
    ]
    missing = [c for c in comparisons if c.verdict == MISSING]
    if missing:
        lines += ["", "MISSING rows and why:", ""]
        reasons: dict[str, list[str]] = {}
        for c in missing:
            reasons.setdefault(c.missing_reason, []).append(c.paper.id)
        lines += [f"- {reason}: {len(ids)} rows ({', '.join(ids)})" for reason, ids in reasons.items()]
    by_table: dict[str, list[Comparison]] = {}
    for c in comparisons:
        by_table.setdefault(c.paper.table, []).append(c)
    substitutes: dict[str, list[Comparison]] = {}
    for c in comparisons:
        if c.paper.kind == "substitute":
            substitutes.setdefault(c.paper.substitute_for, []).append(c)
    header = ["| id | quantity | version | paper | ours | ± SE | difference | tolerance | verdict | evidence |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for table in numbers.tables:
        rows = by_table.get(table.id, [])
        if not rows:
            continue
        printed = [c for c in rows if c.paper.kind == "printed"]
        count = {0: "No printed number", 1: "1 printed number"}.get(len(printed), f"{len(printed)} printed numbers")
        extra = len(rows) - len(printed)
        count += f" and {extra} {'row' if extra == 1 else 'rows'} beside them" if printed and extra else ""
        count += f"; {extra} {'check' if extra == 1 else 'checks'}" if not printed else ""
        lines += ["", f"## {table.title}", "", f"{count}. Tolerance: {table.tolerance_why}.", ""]
        why: dict[str, list[str]] = {}
        for c in rows:
            if c.paper.tolerance.why:
                why.setdefault(c.paper.tolerance.why, []).append(f"`{c.paper.id}`")
        lines += [f"Tolerance of {', '.join(ids)}: {reason}." for reason, ids in why.items()] + ([""] if why else [])
        not_reproducible = {c.paper.not_reproducible for c in printed if c.paper.not_reproducible}
        lines += [f"Not reproducible here: {reason}." for reason in sorted(not_reproducible)]
        lines += [""] + header if not_reproducible else header
        for c in rows:
            if c.paper.kind == "substitute":
                continue  # rendered right after the printed number it stands for
            for s in [c, *substitutes.get(c.paper.id, [])]:
                label = s.paper.id if s is c else f"↳ substitute: {s.paper.id}"
                lines.append(_row(s, s.primary, label))
                lines += [_row(s, other, f"↳ {s.paper.id}, other run") for other in s.values[1:]]
    notes: dict[str, list[str]] = {}  # one line per text, naming every row it applies to
    for c in comparisons:
        for label, text in (("", c.paper.note), ("erratum: ", c.paper.erratum),
                            ("known discrepancy: ", c.paper.known_discrepancy)):
            if text:
                notes.setdefault(label + text, []).append(f"`{c.paper.id}`")
    if notes:
        lines += ["", "## Notes, errata and known discrepancies", ""]
        lines += [f"- {', '.join(ids)}: {text}" for text, ids in notes.items()]
    lines += ["", "## Runs read", ""]
    if not runs:
        lines.append("No results found: run the experiments first (`make figures`).")
    else:
        lines += ["| run | experiment | scale | grid | data / model used | substitution |", "|---|---|---|---|---|---|"]
        for run in runs:
            used = run.provenance.get("description") or run.provenance.get("dataset") or "—"
            grid = "full" if run.coverage.full else f"partial: {run.coverage.summary(limit=len(run.coverage.reduced))}"
            lines.append(f"| {run.label} | {run.experiment} | {run.scale} | {_cell(grid)} | {_cell(used)} | "
                         f"{_cell(run.provenance.get('substitution') or 'none')} |")
    return "\n".join(lines) + "\n"
