"""Runs one of the package's RULER generator scripts: ``python worker.py JOB.json``.

A child process of :func:`experiments.ruler.samples.generate_sample_sets`, standard library (and NLTK) only: it
imports nothing of this project. JOB holds the script, its command line, NLTK's data folder and a log file.
The script is loaded as a module under that command line (the scripts parse their arguments and seed
``random`` / ``numpy`` at import, as when ``data/prepare.py`` runs them) and its ``main()`` writes
``<save_dir>/<save_name>/validation.jsonl``. The scripts retry with a bare ``except`` until a prompt fits, so a
context too short for a task loops for ever and no exception can stop it: the parent ends this process.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import sys
from pathlib import Path


def main(job_path: str) -> None:
    job = json.loads(Path(job_path).read_text())
    import nltk

    nltk.data.path.insert(0, job["nltk_data"])
    script = Path(job["script"])
    sys.argv = [str(script), *job["argv"]]
    # the scripts import `constants` and `tokenizer` from their folders (prepare.py runs them from there)
    sys.path[:0] = [str(script.parent), str(script.parent.parent)]
    spec = importlib.util.spec_from_file_location(f"ruler_generator_{script.stem}", script)
    module = importlib.util.module_from_spec(spec)
    with open(job["log"], "a", encoding="utf-8") as log, contextlib.redirect_stdout(log):
        spec.loader.exec_module(module)
        module.main()


if __name__ == "__main__":
    main(sys.argv[1])
