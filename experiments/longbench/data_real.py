"""The real LongBench-E data: the ``THUDM/LongBench`` dataset repo on the Hugging Face hub, or a local copy.

The hub repo holds one ``data.zip`` with ``data/<name>.jsonl`` and ``data/<name>_e.jsonl`` files; a local
copy may be that zip or a folder of the jsonl files (``<name>_e.jsonl`` or ``data/<name>_e.jsonl``).
Hub access is imported lazily (``huggingface_hub`` ships with ``transformers``) and only used when the
config says ``source: hub``: tests read the small fixture in ``tests/fixtures/longbench/``.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Iterable
from pathlib import Path

from experiments.longbench.prompts import DATASETS
from experiments.longbench.sample import LongBenchSample

__all__ = ["HUB_REPO", "HUB_ARCHIVE", "parse_jsonl_lines", "load_local", "load_hub"]

HUB_REPO = "THUDM/LongBench"
HUB_ARCHIVE = "data.zip"


def _file_name(dataset: str, variant_e: bool) -> str:
    if dataset not in DATASETS:
        raise ValueError(f"unknown LongBench-E dataset {dataset!r}; known: {list(DATASETS)}")
    return f"{dataset}_e.jsonl" if variant_e else f"{dataset}.jsonl"


def parse_jsonl_lines(lines: Iterable[str], dataset: str, where: str) -> list[LongBenchSample]:
    """Samples from jsonl text lines (blank lines skipped); errors name the file and line."""
    samples = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{where}:{number}: not valid JSON ({err.msg})") from err
        try:
            samples.append(LongBenchSample.from_record(record, dataset))
        except ValueError as err:
            raise ValueError(f"{where}:{number}: {err}") from err
    if not samples:
        raise ValueError(f"{where}: no samples")
    return samples


def _read_from_zip(archive: Path, dataset: str, file_name: str) -> list[LongBenchSample]:
    with zipfile.ZipFile(archive) as zf:
        candidates = [n for n in zf.namelist() if n == file_name or n.endswith("/" + file_name)]
        if not candidates:
            raise ValueError(f"{archive} holds no {file_name}")
        with zf.open(sorted(candidates, key=len)[0]) as handle:
            text = handle.read().decode("utf-8")
    return parse_jsonl_lines(text.splitlines(), dataset, f"{archive}!{file_name}")


def load_local(path: str | Path, dataset: str, variant_e: bool = True) -> list[LongBenchSample]:
    """Read ``<dataset>_e.jsonl`` (or ``<dataset>.jsonl``) from a folder or from LongBench's data.zip."""
    root = Path(path).expanduser()
    file_name = _file_name(dataset, variant_e)
    if not root.exists():
        raise ValueError(f"LongBench data path {root} does not exist")
    if root.is_file():
        if not zipfile.is_zipfile(root):
            raise ValueError(f"{root} is neither a folder of jsonl files nor LongBench's data.zip")
        return _read_from_zip(root, dataset, file_name)
    for candidate in (root / file_name, root / "data" / file_name):
        if candidate.is_file():
            with open(candidate, encoding="utf-8") as handle:
                return parse_jsonl_lines(handle, dataset, str(candidate))
    if (root / HUB_ARCHIVE).is_file():
        return _read_from_zip(root / HUB_ARCHIVE, dataset, file_name)
    raise ValueError(f"no {file_name} under {root} (nor data/{file_name}, nor {HUB_ARCHIVE})")


def load_hub(dataset: str, variant_e: bool = True, repo_id: str = HUB_REPO, revision: str | None = None) -> list[LongBenchSample]:
    """Download (or reuse the hub cache of) LongBench's data.zip and read one dataset from it."""
    from huggingface_hub import hf_hub_download  # lazy: only for users with hub access

    archive = hf_hub_download(repo_id=repo_id, filename=HUB_ARCHIVE, repo_type="dataset", revision=revision)
    return _read_from_zip(Path(archive), dataset, _file_name(dataset, variant_e))
