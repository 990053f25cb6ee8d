"""Resumable, tidy results store shared by every experiment.

Layout under ``<results_dir>/<experiment>/``::

    results.csv            one row per measurement, every run of this experiment (tidy, long format)
    config.json            the resolved config of the most recent run (what ``run.py`` composed)
    runs/<config_id>.json  one file per distinct result-relevant config: resolved config (the latest invocation's;
                           every distinct one under ``configs``) + provenance (``unit_slots``: the cells asked for,
                           read with :func:`recorded_unit_ids`)

Identity of a result
    ``config_id`` is a short hash of the *result-relevant* part of the config (by default everything
    except ``paths`` and ``hydra``; an experiment narrows it with a module-level ``RESULT_KEYS``: the
    config values that change its numbers but are not unit keys, so extending a sweep keeps the
    finished units). A *unit* is the smallest piece of work an experiment can redo on its own (e.g.
    one ``(method, bits)`` pair); its ``unit_id`` hashes ``config_id`` together with the unit's keys.
    A unit is done exactly when ``results.csv`` holds rows with its ``unit_id``, all of them whole;
    rows and "done" are therefore written together: appended to the file in one write (the usual case, whose
    cost does not grow with the file), or, where an append cannot store what a rewrite would (a new column,
    a unit stored again), in one atomic file replacement. A killed append leaves at most a cut-short last
    line, which is damaged (below), so a killed run never records a unit as done without its rows.

Damaged files
    ``results.csv`` is checked on every read. A row with a missing field, a cut-short last line or a
    text cell in a numeric column is *damaged*: its unit is not done (the next run recomputes it and
    drops the damaged rows, with a warning naming the file and lines) and :meth:`ResultStore.frame`
    leaves the unit out. Duplicated rows (which the store never writes) and unreadable files are refused
    with a ``ValueError`` naming the file; so are malformed run records (``runs/<config_id>.json``).

Consequences
    * Changing any result-relevant value (dataset, sizes, seed, rotation, ...) gives a new
      ``config_id``: old rows stay in the CSV but are never mixed into the new run's frame.
    * Two experiments never share a directory, so they cannot clobber each other.
    * Several jobs of a Hydra multirun append to the same CSV; writes are serialised by a file lock.
    * A run can be split over processes that share the store: with ``shard=Shard(i, n)`` a store computes only
      the units whose ``unit_id`` is i modulo n (``run.py ... shard=i/n``), so n processes of one command divide
      its missing units without overlap; the shard is not part of the identity, so the rows are the unsplit run's.
    * Files are replaced atomically (a temporary file renamed over the target, created with the usual
      ``0666 & ~umask`` mode, e.g. 0644); a temporary file left by a killed writer is removed by the next.
      ``results.csv`` is read under the lock too (an append is not atomic to a reader), except by a read-only store.
"""

from __future__ import annotations

import contextlib
import csv
import datetime as _dt
import hashlib
import io
import json
import math
import os
import tempfile
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from experiments.data.cache import file_lock

__all__ = ["ResultStore", "Shard", "result_config", "config_to_dict", "experiment_sizes", "recorded_unit_ids"]

#: Top-level config groups that never change a measured number.
NON_RESULT_KEYS: tuple[str, ...] = ("paths", "hydra", "shard")  # shard: which process computes a unit, not what

#: Hash columns, always read back as strings (an all-digit hash must not become an integer).
_ID_COLUMNS: tuple[str, ...] = ("config_id", "unit_id")

#: Columns the store adds to every row (the experiment's own columns follow them).
STORE_COLUMNS: tuple[str, ...] = ("experiment", "config_id", "unit_id", "dataset", "scale", "seed")


def _register_resolvers() -> None:
    """``${pid:}`` for configs/config.yaml's ``hydra.run.dir``: runs started in the same second get their own
    folders. Registered when run.py imports this module, before Hydra composes the config."""
    from omegaconf import OmegaConf

    OmegaConf.register_new_resolver("pid", os.getpid, replace=True)


_register_resolvers()


def config_to_dict(config: Any) -> dict[str, Any]:
    """A plain, fully resolved ``dict`` from an OmegaConf config or a mapping."""
    try:
        from omegaconf import DictConfig, OmegaConf
    except ImportError:  # pragma: no cover - omegaconf ships with hydra-core
        DictConfig = ()  # type: ignore[assignment]
    if DictConfig and isinstance(config, DictConfig):
        return OmegaConf.to_container(config, resolve=True)  # type: ignore[return-value]
    if isinstance(config, Mapping):
        return json.loads(json.dumps(config, default=str))
    raise ValueError(f"config must be a DictConfig or a mapping, got {type(config).__name__}")


def _get_dotted(tree: Mapping[str, Any], dotted: str) -> Any:
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            raise ValueError(f"result key {dotted!r} is not in the config")
        node = node[part]
    return node


def result_config(config: Mapping[str, Any], result_keys: Sequence[str] | None = None) -> dict[str, Any]:
    """The part of ``config`` that determines the measured numbers.

    ``result_keys=None`` keeps every top-level entry except :data:`NON_RESULT_KEYS`; otherwise only the
    listed dotted paths (e.g. ``("experiment", "dataset", "scale.name", "seed")``) are kept.
    """
    if result_keys is None:
        return {k: v for k, v in config.items() if k not in NON_RESULT_KEYS}
    return {key: _get_dotted(config, key) for key in result_keys}


def _short_hash(payload: Any) -> str:
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def experiment_sizes(cfg: Any) -> Any:
    """The sizes block the current scale selects: ``cfg.experiment.sizes[cfg.scale.name]``.

    This is the one pattern by which an experiment picks its sizes per scale (see configs/README.md).
    """
    sizes = cfg.experiment.get("sizes")
    if sizes is None:
        raise ValueError(f"experiment {cfg.experiment.name!r} has no 'sizes' block")
    scale = cfg.scale.name
    if scale not in sizes:
        raise ValueError(
            f"experiment {cfg.experiment.name!r} defines sizes for {sorted(sizes)} but not for scale {scale!r}"
        )
    return sizes[scale]


def _file_mode() -> int:
    """The mode ``open()`` would give a new file: 0666 minus the process umask."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def _atomic_write_text(path: Path, text: str) -> None:
    """Replace ``path`` by ``text`` atomically. Called under the store's lock, so temporary files of
    ``path`` that exist now were left by a killed writer and are removed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    prefix = f".{path.name}."
    for stale in path.parent.glob(f"{prefix}*.tmp"):
        stale.unlink(missing_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=prefix, suffix=".tmp")
    try:
        os.fchmod(fd, _file_mode())
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _read_json(path: Path) -> dict[str, Any]:
    try:
        record = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: not a readable JSON run record ({error}); restore or delete it") from error
    if not isinstance(record, dict):
        raise ValueError(f"{path}: a run record must be a JSON object, got {type(record).__name__}")
    return record


@dataclass(frozen=True)
class Shard:
    """Part ``index`` of ``count`` of a run's units: those whose ``unit_id`` (a hex hash) is ``index`` modulo
    ``count``, so every unit belongs to exactly one shard of the same command."""

    index: int
    count: int

    def __post_init__(self) -> None:
        if not (isinstance(self.index, int) and isinstance(self.count, int) and 0 <= self.index < self.count):
            raise ValueError(f"shard={self.index}/{self.count}: expected i/n with 0 <= i < n (part i of n)")

    @classmethod
    def parse(cls, text: str) -> Shard:
        """``"i/n"`` (e.g. ``shard=0/4`` on the command line) -> ``Shard(i, n)``; anything else is refused."""
        index, sep, count = str(text).partition("/")
        if not (sep and index.strip().isdigit() and count.strip().isdigit()):
            raise ValueError(f"shard={text!r}: expected i/n, e.g. shard=0/4 (part 0 of 4)")
        return cls(int(index), int(count))

    def holds(self, unit_id: str) -> bool:
        return int(unit_id, 16) % self.count == self.index


@dataclass(frozen=True)
class _Rows:
    """What ``results.csv`` holds: its whole rows (``frame``) and, by line number, why other rows are damaged."""

    frame: pd.DataFrame
    damaged: dict[int, str]       # line number -> reason
    damaged_units: frozenset[str]  # unit ids with at least one damaged row (never done)


def _number(cell: str) -> float:
    """A cell as a float, NaN where it is not a number (as ``pd.to_numeric(errors="coerce")``, which pandas 2.3
    cannot be trusted with: a hex digest such as ``"204e75509838377d..."``, digits, an ``e`` and a long run of digits,
    crashes its parser with a segmentation fault). A finite-looking literal whose value overflows is not a number;
    ``inf`` and ``nan`` written out are."""
    try:
        value = float(cell)
    except (TypeError, ValueError):
        return math.nan
    if math.isinf(value) and cell.strip().lstrip("+-").lower() not in ("inf", "infinity"):
        return math.nan
    return value


def _numbers(cells: pd.Series) -> pd.Series:
    """:func:`_number` of every cell (float64, same index)."""
    return pd.Series([_number(cell) for cell in cells], index=cells.index, dtype=np.float64)


def _text_among_numbers(column: pd.Series) -> np.ndarray:
    """True for the cells of a column that do not parse as numbers although at least half of its cells do."""
    cells = column.dropna()
    numbers = _numbers(cells)
    text = cells.index[numbers.isna()] if numbers.notna().sum() * 2 >= len(cells) else []
    return column.index.isin(text)


def _parse_rows(path: Path, text: str) -> _Rows:
    """Parse and check the text of a results file (see the module docstring, "Damaged files")."""
    if "\0" in text:
        raise ValueError(f"{path}: not a readable CSV file (it contains NUL bytes)")
    reader = csv.reader(io.StringIO(text))
    try:
        records = [(reader.line_num, record) for record in reader]
    except csv.Error as error:
        raise ValueError(f"{path}: not a readable CSV file ({error})") from error
    if not records:
        return _Rows(pd.DataFrame(columns=list(STORE_COLUMNS)), {}, frozenset())
    header = records[0][1]
    missing = [c for c in _ID_COLUMNS if c not in header]
    if missing or len(set(header)) != len(header):
        raise ValueError(f"{path}: the header must name each column once and include {list(_ID_COLUMNS)}, "
                         f"got {header}")
    body = records[1:]
    damaged = {line: f"has {len(record)} fields, the header {len(header)}"
               for line, record in body if len(record) != len(header)}
    if body and not text.endswith(("\n", "\r")):
        damaged[body[-1][0]] = "is cut short (the file does not end with a line break)"
    whole = [(line, record) for line, record in body if line not in damaged]
    cells = pd.DataFrame([record for _, record in whole], columns=header, index=[line for line, _ in whole],
                         dtype=object).replace("", pd.NA)
    for column in (c for c in header if c not in _ID_COLUMNS):
        for line in cells.index[_text_among_numbers(cells[column])]:
            damaged[line] = f"holds {cells.at[line, column]!r} in the numeric column {column!r}"
    repeated = cells[cells.duplicated(keep=False)]
    if not repeated.empty:
        raise ValueError(f"{path}: lines {sorted(repeated.index)} are duplicated rows (the store writes each "
                         "row once: a merge or a copy went wrong); remove the copies")
    unit_column = header.index("unit_id")
    units_of = {line: record[unit_column] for line, record in body if len(record) > unit_column}
    damaged_units = frozenset(units_of[line] for line in damaged if line in units_of)
    good = [record for line, record in whole if line not in damaged]
    buffer = io.StringIO()
    csv.writer(buffer).writerows([header, *good])
    buffer.seek(0)
    frame = pd.read_csv(buffer, low_memory=False, dtype={c: str for c in _ID_COLUMNS}, float_precision="round_trip")
    return _Rows(frame, dict(sorted(damaged.items())), damaged_units)


def recorded_unit_ids(provenance: Mapping[str, Any]) -> list[str] | None:
    """The cells a run record says its config's grid asked for (:meth:`ResultStore.record_units`): the keys of
    ``unit_slots``, or the ``unit_ids`` list of a record written before slots were kept; None when the record
    names no cells (an experiment that does not record them)."""
    if "unit_slots" in provenance:
        return list(provenance["unit_slots"])
    return list(provenance["unit_ids"]) if "unit_ids" in provenance else None


class ResultStore:
    """Tidy CSV of measurements for one experiment, resumable unit by unit.

    Args:
        results_dir: root results folder (``<repo>/results``); the store uses ``results_dir/experiment``.
        experiment: experiment name (a directory name: letters, digits, ``_``, ``-``).
        config: the run's full config (DictConfig or mapping); stored resolved as JSON.
        result_keys: dotted config paths that determine the results (default: all but paths/hydra).
    """

    def __init__(
        self,
        results_dir: str | os.PathLike[str],
        experiment: str,
        config: Any,
        result_keys: Sequence[str] | None = None,
        read_only: bool = False,
        shard: Shard | None = None,
    ) -> None:
        """``read_only``: a store that reads rows and run records but writes nothing (``scripts/replot.py``);
        ``shard``: :meth:`run_units` computes only that shard's units (every unit is still read back)."""
        if not experiment or not all(c.isalnum() or c in "_-" for c in experiment):
            raise ValueError(f"experiment name must be a non-empty [A-Za-z0-9_-] string, got {experiment!r}")
        self.experiment = experiment
        self.directory = Path(results_dir) / experiment
        self.csv_path = self.directory / "results.csv"
        self.config = config_to_dict(config)
        self.result_config = result_config(self.config, result_keys)
        self.config_id = _short_hash(self.result_config)
        self.run_path = self.directory / "runs" / f"{self.config_id}.json"
        self._lock_path = self.directory / ".lock"
        self._parsed: tuple[tuple[int, int, int], _Rows] | None = None  # results.csv's stat and contents
        self._numeric: frozenset[str] | None = None  # the columns the last full read found numeric (_append)
        self.context = {
            "experiment": experiment,
            "config_id": self.config_id,
            "dataset": self._config_value("dataset", "name"),
            "scale": self._config_value("scale", "name"),
            "seed": self.config.get("seed"),
        }
        self.read_only = read_only
        self.shard = shard
        if not read_only:
            self._write_run_record()

    # ------------------------------------------------------------------ identity
    def _config_value(self, group: str, key: str) -> Any:
        node = self.config.get(group)
        return node.get(key) if isinstance(node, Mapping) else None

    def unit_id(self, unit: Mapping[str, Any]) -> str:
        """Hash of this run's ``config_id`` and the unit's keys (order-independent)."""
        if not isinstance(unit, Mapping) or not unit:
            raise ValueError(f"a unit must be a non-empty mapping of its keys, got {unit!r}")
        clash = set(unit) & set(STORE_COLUMNS)
        if clash:
            raise ValueError(f"unit keys {sorted(clash)} clash with the store's own columns")
        return _short_hash({"config_id": self.config_id, "unit": dict(unit)})

    # ------------------------------------------------------------------ records
    def _write_run_record(self, provenance: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None) -> None:
        """Write this run's record; ``provenance(stored)`` gives the entries to add to the stored provenance (read
        and written under the store's lock, so concurrent writers merge rather than overwrite)."""
        if self.read_only:
            raise ValueError(f"{self.run_path}: this store is read-only (it reads stored results, writes nothing)")
        with file_lock(self._lock_path):
            record: dict[str, Any] = {}
            if self.run_path.exists():
                record = _read_json(self.run_path)
            now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
            record.setdefault("created", now)
            # every distinct config that ran under this config_id (several processes may each run a subset of
            # the methods or grid into one store; ``config`` alone would keep only the last writer's subset)
            configs = record.get("configs", {})
            if not configs and "config" in record:  # a record written before configs were kept: its config stays
                configs[_short_hash(record["config"])] = {"first_written": record.get("created", now),
                                                          "config": record["config"]}
            configs.setdefault(_short_hash(self.config), {"first_written": now, "config": self.config})
            record.update(
                experiment=self.experiment,
                config_id=self.config_id,
                updated=now,
                result_config=self.result_config,
                config=self.config,
                configs=configs,
            )
            if provenance is not None:  # an entry given as None is removed
                stored = record.get("provenance", {})
                record["provenance"] = {k: v for k, v in {**stored, **dict(provenance(stored))}.items()
                                        if v is not None}
            _atomic_write_text(self.run_path, json.dumps(record, indent=2, sort_keys=True, default=str))
            _atomic_write_text(
                self.directory / "config.json", json.dumps(self.config, indent=2, sort_keys=True, default=str)
            )

    def record_provenance(self, **info: Any) -> None:
        """Store what was actually used (dataset description, substitution, model, versions) for this run."""
        self._write_run_record(lambda stored: info)

    def record_units(
        self,
        units: Sequence[Mapping[str, Any]],
        versioned: Sequence[str] = (),
        replicate: Callable[[Mapping[str, Any]], Any] | None = None,
    ) -> None:
        """Record ``units`` as cells of this config's current grid (``provenance["unit_slots"]``: unit_id -> slot,
        which the paper comparisons count through :func:`recorded_unit_ids`), merged with the cells earlier
        invocations recorded.

        The merge is a union by *slot*, a unit without its ``versioned`` keys (e.g. ``method_options``,
        ``protocol``): a new unit replaces a recorded one of the same slot (rows made with a method's earlier
        options stop counting) and leaves the other slots recorded (a process that ran a subset of the methods
        or contexts does not erase the others'). ``replicate(unit)``, where given and not None, names a draw the
        versioned keys carry (e.g. a rotation seed among a method's options): each draw is a slot of its own, so
        a process that ran seeds 1-2 of a method leaves its seed 0 recorded. The cells of a record written before
        slots were kept (``unit_ids`` only) stay recorded, each its own slot.
        """
        def slot(unit: Mapping[str, Any]) -> str:
            key = {k: v for k, v in unit.items() if k not in versioned}
            draw = replicate(unit) if replicate is not None else None
            return _short_hash(key if draw is None else {**key, "replicate": draw})

        slots = {self.unit_id(unit): slot(unit) for unit in units}

        def merged(stored: Mapping[str, Any]) -> dict[str, Any]:
            new_slots = set(slots.values())
            earlier = stored.get("unit_slots") or {uid: uid for uid in stored.get("unit_ids", [])}
            kept = {uid: slot for uid, slot in earlier.items() if slot not in new_slots and uid not in slots}
            return {"unit_ids": None, "unit_slots": {**kept, **slots}}

        self._write_run_record(merged)

    def provenance(self) -> dict[str, Any]:
        if not self.run_path.exists():
            return {}
        return _read_json(self.run_path).get("provenance", {})

    # ------------------------------------------------------------------ rows
    def _rows(self, locked: bool = False) -> _Rows:
        """The checked contents of ``results.csv`` (parsed again only when the file changed), read under the
        store's lock unless the caller holds it (``locked``) or the store is read-only."""
        with contextlib.nullcontext() if locked or self.read_only else file_lock(self._lock_path):
            try:
                stat = self.csv_path.stat()
            except FileNotFoundError:
                return _Rows(pd.DataFrame(columns=list(STORE_COLUMNS)), {}, frozenset())
            key = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
            if self._parsed is not None and self._parsed[0] == key:
                return self._parsed[1]
            try:
                text = self.csv_path.read_text()
            except (OSError, UnicodeDecodeError) as error:
                raise ValueError(f"{self.csv_path}: not a readable results file ({error})") from error
        rows = _parse_rows(self.csv_path, text)
        self._parsed = (key, rows)
        self._numeric = frozenset(c for c in rows.frame.columns if pd.api.types.is_numeric_dtype(rows.frame[c])
                                  and not pd.api.types.is_bool_dtype(rows.frame[c]))
        return rows

    def _whole_rows(self, rows: _Rows, action: str) -> pd.DataFrame:
        """``rows.frame`` without the units that have damaged rows, warning about those rows."""
        if not rows.damaged:
            return rows.frame
        lines = "; ".join(f"line {line} {reason}" for line, reason in rows.damaged.items())
        warnings.warn(f"{self.csv_path}: damaged rows ({lines}); their units are {action}", RuntimeWarning,
                      stacklevel=3)
        return rows.frame[~rows.frame["unit_id"].isin(rows.damaged_units)]

    def is_done(self, unit: Mapping[str, Any]) -> bool:
        """True when this unit's rows are in ``results.csv`` for this config, none of them damaged."""
        unit_id = self.unit_id(unit)
        rows = self._rows()
        return unit_id not in rows.damaged_units and bool((rows.frame["unit_id"] == unit_id).any())

    def save_unit(self, unit: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> None:
        """Append a unit's rows (each merged with the unit keys and the run context) atomically."""
        if self.read_only:
            raise ValueError(f"{self.csv_path}: this store is read-only (it reads stored results, writes nothing)")
        unit_id = self.unit_id(unit)
        if not rows:
            raise ValueError(f"unit {dict(unit)} produced no rows; a unit must record at least one measurement")
        records = []
        for row in rows:
            overlap = {k for k in row if k in unit and row[k] != unit[k]}
            if overlap:
                raise ValueError(f"row values for {sorted(overlap)} contradict the unit {dict(unit)}")
            records.append({**self.context, "unit_id": unit_id, **dict(unit), **dict(row)})
        new = pd.DataFrame.from_records(records)
        repeated = new.astype(str).duplicated(keep=False)
        if repeated.any():
            raise ValueError(f"unit {dict(unit)}: rows {list(new.index[repeated])} are identical; the rows of a "
                             "unit must differ in some column")
        with file_lock(self._lock_path):
            if self._append(unit_id, new):
                return
            old = self._whole_rows(self._rows(locked=True), "dropped, to be recomputed")
            old = old[old["unit_id"] != unit_id]  # a unit is written whole, exactly once
            frames = [df for df in (old, new) if not df.empty]
            columns = list(dict.fromkeys(c for df in frames for c in df.columns))
            # all-NA columns (a field this unit does not have, e.g. a seed) take no part in the dtypes
            merged = (pd.concat([df.dropna(axis=1, how="all") for df in frames], ignore_index=True)
                      .reindex(columns=columns) if len(frames) > 1 else frames[0])
            text = merged.to_csv(index=False)
            damaged = _parse_rows(self.csv_path, text).damaged
            if damaged:  # what a later read would call damaged is never written
                raise ValueError(f"unit {dict(unit)}: cannot store rows that would read back damaged: "
                                 + "; ".join(f"line {line} {reason}" for line, reason in damaged.items()))
            _atomic_write_text(self.csv_path, text)

    def _append(self, unit_id: str, new: pd.DataFrame) -> bool:
        """Append a unit's rows to ``results.csv`` (the caller holds the lock) in one write, reading none of the
        stored rows, where that stores what the rewrite of :meth:`save_unit` would: the file ends with a whole
        line, its header names every column of the rows, it holds no row of this unit, and the rows read back
        whole, with numbers in every column the last full read found numeric. False otherwise (the caller
        rewrites the file). The rewrite parses and writes the whole file, so its cost grows with the file; under
        the lock it serialises every process that shares the store."""
        if self._numeric is None:
            self._rows(locked=True)
        try:
            stored = self.csv_path.read_bytes()
        except FileNotFoundError:
            return False
        if not stored.endswith(b"\n") or unit_id.encode() in stored:
            return False
        header_line = stored[:stored.index(b"\n") + 1].decode()
        header = next(csv.reader([header_line]))
        if not set(new.columns) <= set(header):
            return False
        text = new.reindex(columns=header).to_csv(index=False, header=False)
        if _parse_rows(self.csv_path, header_line + text).damaged:
            return False
        records = list(csv.reader(io.StringIO(text)))
        for column in (self._numeric or frozenset()) & set(header):  # as _text_among_numbers reads the whole file
            cells = pd.Series([record[header.index(column)] for record in records], dtype=object).replace("", pd.NA)
            if _numbers(cells.dropna()).isna().any():
                return False
        fd = os.open(self.csv_path, os.O_WRONLY | os.O_APPEND)
        size = os.fstat(fd).st_size
        try:
            payload = memoryview(text.encode())
            while payload:
                payload = payload[os.write(fd, payload):]
            os.fsync(fd)
        except BaseException:
            os.ftruncate(fd, size)  # no part of the unit stays behind
            raise
        finally:
            os.close(fd)
        return True

    def missing_units(self, units: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        """The units of ``units`` not stored yet (of this store's shard, when it has one), in order: what
        :meth:`run_units` would compute."""
        return [unit for unit in units if not self.is_done(unit)
                and (self.shard is None or self.shard.holds(self.unit_id(unit)))]

    def run_units(self, units: Sequence[Mapping[str, Any]], compute: Callable[..., Any], *,
                  prepare: Callable[[list[Mapping[str, Any]]], Any] | None = None,
                  batches: Callable[[list[Mapping[str, Any]], Any], list[list[Mapping[str, Any]]]] | None = None,
                  progress: str | Callable[[Any], str] = "units") -> pd.DataFrame:
        """The unit loop of every experiment: compute the units of ``units`` that are not stored yet, in order,
        storing each as soon as it is computed (a killed run resumes at the first missing unit); return the rows
        of ``units`` (:meth:`frame`).

        ``prepare(missing)`` runs once, before the first missing unit and only when one is missing (load the data
        or the model, record provenance); what it returns is handed to every ``compute``. ``compute(unit,
        prepared)`` returns the unit's rows. With ``batches(missing, prepared)``, which groups the missing units into
        batches computed together (prompts of one generation), ``compute(batch, prepared)`` returns one list of rows per
        unit of the batch, or None when the batch failed and is left missing (the caller says why). ``progress``
        labels the progress bar (a callable gets what ``prepare`` returned). With a :class:`Shard`, only its
        missing units are computed; the rows returned are still all the stored rows of ``units``.
        """
        missing = self.missing_units(units)
        if missing:
            prepared = prepare(missing) if prepare is not None else None
            groups = batches(missing, prepared) if batches is not None else missing
            for group in tqdm(groups, desc=progress(prepared) if callable(progress) else progress, unit="unit"):
                if batches is None:
                    self.save_unit(group, compute(group, prepared))
                    continue
                rows = compute(group, prepared)
                if rows is None:
                    continue
                if len(rows) != len(group):
                    raise ValueError(f"a batch of {len(group)} units gave rows for {len(rows)}")
                for unit, unit_rows in zip(group, rows):
                    self.save_unit(unit, unit_rows)
        return self.frame(units)

    def frame(self, units: Sequence[Mapping[str, Any]] | None = None, all_configs: bool = False) -> pd.DataFrame:
        """Rows of this run's config, optionally only those of ``units`` (``all_configs=True``: every row).

        ``frame.attrs["provenance"]`` carries :meth:`provenance` (what data/model was actually used), so
        a ``plot(df, cfg, figures_dir)`` can title its figure with it; with ``units``, ``frame.attrs["units"]``
        says how many were asked and how many have no rows yet.
        """
        df = self._whole_rows(self._rows(), "left out until a run recomputes them")
        if all_configs:
            if units is not None:
                raise ValueError("units select rows of this config; they cannot be combined with all_configs")
        else:
            df = df[df["config_id"] == self.config_id]
        if units is not None:
            wanted = {self.unit_id(unit) for unit in units}
            df = df[df["unit_id"].isin(wanted)]
        df = df.reset_index(drop=True)
        df.attrs["provenance"] = self.provenance()
        df.attrs["config_id"] = self.config_id
        if units is not None:  # a run cut short: experiments.coverage.frame_coverage labels its tables "partial"
            df.attrs["units"] = {"asked": len(wanted), "missing": len(wanted - set(df["unit_id"]))}
        return df
