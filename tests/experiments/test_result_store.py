"""What the result store guarantees about its files beyond tests/test_bad_inputs.py's damaged-file cases:
runs of one second get their own Hydra folders, and a resumed store reads each changed file once."""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

import run
from experiments.io import ResultStore, Shard

CONFIGS = Path(run.__file__).resolve().parent / "configs"
CONFIG = {"experiment": {"name": "toy"}, "dataset": {"name": "toy_data"}, "scale": {"name": "quick"}, "seed": 0}


def test_hydra_run_dir_names_the_process() -> None:
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        cfg = compose(config_name="config", overrides=["experiment=distortion"], return_hydra_config=True)
    run_dir = cfg.hydra.run.dir
    assert run_dir.startswith("outputs/distortion/") and run_dir.endswith(f"_{os.getpid()}")


def test_store_parses_results_again_only_when_the_file_changes(tmp_path: Path, monkeypatch) -> None:
    store = ResultStore(tmp_path, "toy", CONFIG)
    store.save_unit({"bits": 1}, [{"value": 1.0}])
    reads = []
    read_text = Path.read_text
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: reads.append(self.name) or read_text(self, *a, **k))
    assert store.is_done({"bits": 1}) and not store.is_done({"bits": 2}) and len(store.frame()) == 1
    assert reads.count("results.csv") == 1
    store.save_unit({"bits": 2}, [{"value": 2.0}])
    assert store.is_done({"bits": 2}) and reads.count("results.csv") == 2


def test_stored_floats_survive_the_rewrites_of_later_units(tmp_path: Path) -> None:
    """A float the default pandas parser reads one ulp off (54.362499146542284) keeps its text and value through
    later saves, appended or rewritten (a new column forces the rewrite)."""
    store = ResultStore(tmp_path, "toy", CONFIG)
    store.save_unit({"bits": 1}, [{"value": 54.362499146542284}])
    store.save_unit({"bits": 2}, [{"value": 2.0}])
    store.save_unit({"bits": 3}, [{"value": 3.0, "new_column": 1}])
    assert "54.362499146542284" in (tmp_path / "toy" / "results.csv").read_text()
    assert store.frame()["value"].iloc[0] == 54.362499146542284


def test_a_digest_that_looks_like_an_exponent_is_stored_and_read_as_text(tmp_path: Path) -> None:
    """pandas 2.3's default number parser crashes the process (a segmentation fault) on a cell of digits, ``e`` and
    a long run of digits, the start of some sha256 digests (RULER's ``input_sha256``); the store and the
    comparison's reader parse such cells as text, and a numeric column keeps its numbers."""
    from experiments.compare import load_runs

    digest = "204e75509838377d52dd7d6bceb27e02648b42e5b7ddd81ce11b6e5beec073e9"
    store = ResultStore(tmp_path, "toy", CONFIG)
    store.save_unit({"bits": 1}, [{"value": 1.0, "input_sha256": digest}])
    store.save_unit({"bits": 2}, [{"value": 2.0, "input_sha256": "204e75509838377"}])  # appended
    frame = store.frame()
    assert list(frame["input_sha256"]) == [digest, "204e75509838377"] and list(frame["value"]) == [1.0, 2.0]
    (run_,) = load_runs(tmp_path)
    assert list(run_.frame["input_sha256"]) == [digest, "204e75509838377"]


def test_run_units_computes_only_the_missing_units_and_prepares_once(tmp_path: Path) -> None:
    config = {"experiment": {"name": "loop"}, "seed": 0}
    store = ResultStore(tmp_path, "loop", config)
    units = [{"k": k} for k in range(4)]
    store.save_unit(units[1], [{"value": 10}])
    prepared, computed = [], []

    def prepare(missing):
        prepared.append([u["k"] for u in missing])
        return 100

    def compute(unit, offset):
        computed.append(unit["k"])
        return [{"value": offset + unit["k"]}]

    frame = store.run_units(units, compute, prepare=prepare)
    assert prepared == [[0, 2, 3]] and computed == [0, 2, 3]
    assert sorted(frame["value"]) == [10, 100, 102, 103]
    again = store.run_units(units, compute, prepare=prepare)  # everything stored: nothing prepared or computed
    assert prepared == [[0, 2, 3]] and computed == [0, 2, 3] and len(again) == 4


def test_run_units_in_batches_leaves_a_failed_batch_missing(tmp_path: Path) -> None:
    store = ResultStore(tmp_path, "batches", {"experiment": {"name": "batches"}, "seed": 0})
    units = [{"k": k} for k in range(5)]
    seen = []

    def compute(batch, _):
        seen.append([u["k"] for u in batch])
        return None if batch[0]["k"] == 2 else [[{"value": u["k"]}] for u in batch]

    frame = store.run_units(units, compute,
                            batches=lambda missing, _: [missing[i:i + 2] for i in range(0, len(missing), 2)])
    assert seen == [[0, 1], [2, 3], [4]]
    assert sorted(frame["k"]) == [0, 1, 4]
    assert not store.is_done(units[2]) and not store.is_done(units[3])
    with pytest.raises(ValueError, match="a batch of 2 units gave rows for 1"):
        store.run_units(units, lambda batch, _: [[{"value": 0}]], batches=lambda missing, _: [missing])


def _save_units(directory: str, worker: int, count: int) -> None:
    store = ResultStore(directory, "shared", {"seed": 0})
    for index in range(count):
        store.save_unit({"worker": worker, "index": index}, [{"value": float(index)}])


def test_processes_sharing_a_store_keep_every_unit(tmp_path: Path) -> None:
    """The H200 runs start several processes on one store (scripts/h200_llm.sh parallel): its file lock makes
    each append (or read-merge-write) whole, so no process loses or overwrites units another stored meanwhile."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_save_units, args=(str(tmp_path), w, 15)) for w in range(3)]
    for process in workers:
        process.start()
    for process in workers:
        process.join(timeout=120)
        assert process.exitcode == 0
    frame = ResultStore(tmp_path, "shared", {"seed": 0}).frame()
    assert len(frame) == 45 and frame["unit_id"].is_unique
    assert sorted(frame.groupby("worker").size()) == [15, 15, 15]


def _longbench_like_rows(i: int) -> list[dict]:
    """Rows of the shapes the LLM experiments store: text with commas, quotes and line breaks, ints, floats, bools,
    a field some rows lack."""
    return [{"prediction": f'line one, "{i}"\nline two', "score": i / 7, "new_tokens": i, "truncated": i % 2 == 0,
             **({"seed": 0} if i % 3 else {}), "metric": metric} for metric in ("f1", "rouge")]


def test_a_unit_is_appended_as_the_rewrite_would_store_it_without_reading_the_stored_rows(tmp_path: Path,
                                                                                           monkeypatch) -> None:
    """With many processes on one store, a save that parses and rewrites the whole file (under the lock) is what
    bounds the run; an append writes the same text and parses only the new rows."""
    import experiments.io as store_module

    appended, rewritten = (ResultStore(tmp_path / name, "toy", CONFIG) for name in ("appended", "rewritten"))
    monkeypatch.setattr(rewritten, "_append", lambda unit_id, new: False)
    for i in range(6):
        for store in (appended, rewritten):
            store.save_unit({"sample": i}, _longbench_like_rows(i))
    assert appended.csv_path.read_bytes() == rewritten.csv_path.read_bytes()
    parsed = []
    parse_rows = store_module._parse_rows
    monkeypatch.setattr(store_module, "_parse_rows", lambda path, text: parsed.append(text) or parse_rows(path, text))
    appended.save_unit({"sample": 6}, _longbench_like_rows(6))
    rewritten.save_unit({"sample": 6}, _longbench_like_rows(6))
    assert appended.csv_path.read_bytes() == rewritten.csv_path.read_bytes()
    records = [len(list(csv.reader(io.StringIO(text)))) for text in parsed]
    assert records[0] == 3 and records[-1] == 15  # the append: header and its 2 rows; the rewrite: all 14
    assert len(appended.frame()) == 14 and appended.is_done({"sample": 6})


def test_an_append_cut_short_leaves_no_row(tmp_path: Path, monkeypatch) -> None:
    store = ResultStore(tmp_path, "toy", CONFIG)
    store.save_unit({"sample": 0}, _longbench_like_rows(0))
    before = store.csv_path.read_bytes()
    write = os.write

    def fail_halfway(fd, data):
        write(fd, bytes(data)[:len(data) // 2])
        raise OSError("no space left on device")
    monkeypatch.setattr(os, "write", fail_halfway)
    with pytest.raises(OSError, match="no space"):
        store.save_unit({"sample": 1}, _longbench_like_rows(1))
    monkeypatch.undo()
    assert store.csv_path.read_bytes() == before and not store.is_done({"sample": 1})


def test_shards_divide_the_missing_units_and_each_reads_every_row(tmp_path: Path) -> None:
    """n stores of one config with shards 0/n .. n-1/n compute disjoint sets of units whose union is every missing
    unit; the rows they write are the unsplit run's (the shard is not part of the identity)."""
    config = {"experiment": {"name": "split"}, "seed": 0}
    units = [{"k": k} for k in range(40)]
    computed: list[list[int]] = []
    for index in range(3):
        store = ResultStore(tmp_path, "split", config, shard=Shard(index, 3))
        mine: list[int] = []
        frame = store.run_units(units, lambda unit, _, mine=mine: mine.append(unit["k"]) or [{"value": unit["k"]}])
        computed.append(mine)
        assert len(frame) == sum(map(len, computed))  # every stored row of the units, not the shard's alone
    assert sorted(k for part in computed for k in part) == list(range(40)) and all(computed)
    unsplit = ResultStore(tmp_path, "split", config)
    assert unsplit.config_id == store.config_id and all(unsplit.is_done(unit) for unit in units)
    assert ResultStore(tmp_path, "split", {**config, "shard": "1/3"}).config_id == unsplit.config_id


@pytest.mark.parametrize("text", ["3/3", "1", "a/2", "-1/2", "1/0", ""])
def test_a_malformed_shard_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="shard"):
        Shard.parse(text)


def test_run_py_takes_the_shard_out_of_the_config() -> None:
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        cfg = compose(config_name="config", overrides=["experiment=distortion", "shard=1/4"])
    assert run.take_shard(cfg) == Shard(1, 4) and "shard" not in cfg
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        cfg = compose(config_name="config", overrides=["experiment=distortion"])
    assert run.take_shard(cfg) is None
