"""RULER samples for one model: the package's generators run in a child process, their output cached on disk.

Prompts follow the package's ``data/prepare.py``: the generator's ``--template`` is the *model template* around
RULER's task template, then the answer prefix, and ``--max_seq_length`` (the context, e.g. 4096) bounds the
prompt plus RULER's generation length, both counted with the model's own tokenizer (the package's ``hf``
tokenizer, loaded from a copy of the model's tokenizer saved for it). The model template is the model's chat
template as the needle experiment applies it: ``apply_chat_template`` of one user turn (after a system turn when
``system`` is set), with the generation prompt; without a chat template, the package's ``base`` template.
RULER fills the whole template, so its single-needle rewording (``are`` -> ``is``, ``Some`` -> ``A``) applies to a
chat template's default system prompt too, as in RULER itself.

The generators draw from ``random`` / ``numpy`` seeded by ``--random_seed`` (RULER: 42), so a (task, context,
samples, seed, tokenizer, template) always gives the same samples; they are cached as the package's jsonl under
``<cache_dir>/ruler_samples/`` (the user cache dir, :func:`experiments.data.cache.cache_root`), one generating
process per model at a time (runs of several methods in parallel share the cache), and every result row records
its prompt's SHA-256, so paired comparisons are checked to be on the same prompts.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiments.data.cache import file_lock, save_text_atomically
from experiments.ruler.library import (RulerTask, generator_argv, generator_script, nltk_data_dir, prompt_template,
                                       read_manifest)

__all__ = ["RulerSample", "model_template", "tokenizer_fingerprint", "generate_sample_sets"]

_WORKER = Path(__file__).with_name("worker.py")
_SLOT = "\uE000TASK\uE000"  # a private-use marker where RULER's task template goes in the chat template


@dataclass(frozen=True)
class RulerSample:
    """One generated sample: the full prompt text (model template included), its references, and the
    package's ``length`` (prompt tokens + RULER's generation length)."""

    task: str
    context: int
    index: int
    text: str
    references: tuple[str, ...]
    length: int

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()


def model_template(tokenizer: Any, system: str = "") -> str:
    """The model template (with ``{task_template}``) the generators get, like the package's ``Templates``."""
    if not getattr(tokenizer, "chat_template", None):
        from long_context_eval.data.template import Templates

        return Templates["base"]
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": _SLOT}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if text.count(_SLOT) != 1:
        raise ValueError("the chat template must contain the user's message exactly once")
    if "{" in text or "}" in text:
        raise ValueError("the chat template renders braces; RULER's templates are str.format strings")
    return text.replace(_SLOT, "{task_template}")


def tokenizer_fingerprint(tokenizer_dir: Path) -> str:
    """SHA-256 over the saved tokenizer files (what the generators count tokens with)."""
    digest = hashlib.sha256()
    for path in sorted(tokenizer_dir.iterdir()):
        if path.is_file():
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


@dataclass(frozen=True)
class _Job:
    task: RulerTask
    context: int
    argv: list[str]
    cached: Path


def _samples_from_manifest(task: RulerTask, context: int, path: Path) -> list[RulerSample]:
    return [RulerSample(task=task.name, context=context, index=int(line["index"]), text=str(line["input"]),
                        references=tuple(str(r) for r in line["outputs"]), length=int(line["length"]))
            for line in read_manifest(path)]


def _run_jobs(jobs: list[_Job], work: Path, timeout_s: float, workers: int) -> dict[int, str]:
    """Run each job in its own worker process, ``workers`` at a time; per failed job index, why. A job still
    running after ``timeout_s`` seconds is ended (the package's retry loop never ends when no prompt fits)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    errors: dict[int, str] = {}
    queue = list(range(len(jobs)))
    running: dict[int, tuple[subprocess.Popen, float]] = {}
    try:
        while queue or running:
            while queue and len(running) < workers:
                index = queue.pop(0)
                job_path = work / f"job_{index}.json"
                job_path.write_text(json.dumps({"script": str(generator_script(jobs[index].task)),
                                                "argv": jobs[index].argv, "nltk_data": str(nltk_data_dir()),
                                                "log": str(work / f"job_{index}.log")}))
                with open(work / f"job_{index}.stderr", "wb") as stderr:
                    process = subprocess.Popen([sys.executable, str(_WORKER), str(job_path)], stdin=subprocess.DEVNULL,
                                               stdout=subprocess.DEVNULL, stderr=stderr, env=env)
                running[index] = (process, time.monotonic())
            for index, (process, started) in list(running.items()):
                if process.poll() is not None:
                    del running[index]
                    if process.returncode != 0:
                        tail = (work / f"job_{index}.stderr").read_text(errors="replace").strip().splitlines()[-3:]
                        errors[index] = f"the generator exited with {process.returncode}: " + " | ".join(tail)
                elif time.monotonic() - started > timeout_s:
                    process.kill()
                    process.wait()
                    del running[index]
                    errors[index] = (f"the package's generator found no prompt that fits within {timeout_s:g} s (its "
                                     "retry loop does not end when the context is too short for the task)")
            time.sleep(0.2)
    finally:
        for process, _ in running.values():
            process.kill()
            process.wait()
    return errors


def generate_sample_sets(
    requests: Sequence[tuple[RulerTask, int]],
    tokenizer: Any,
    *,
    num_samples: int,
    random_seed: int,
    system: str,
    cache_dir: Path,
    timeout_s: float,
    workers: int = 1,
) -> tuple[dict[tuple[str, int], list[RulerSample]], dict[tuple[str, int], str]]:
    """The samples of each (task, context) in ``requests`` (from the cache, else generated by ``workers``
    concurrent generator processes), and the (task, context) pairs whose generation failed, with the reason."""
    template = model_template(tokenizer, system)
    out: dict[tuple[str, int], list[RulerSample]] = {}
    failures: dict[tuple[str, int], str] = {}
    # one generating process per cache folder: a concurrent run of the same model waits, then reads the cache
    with file_lock(cache_dir / ".generate.lock"), tempfile.TemporaryDirectory(prefix="ruler_") as tmp:
        work = Path(tmp)
        tokenizer_dir = work / "tokenizer"
        tokenizer.save_pretrained(tokenizer_dir)
        fingerprint = tokenizer_fingerprint(tokenizer_dir)
        jobs = []
        for task, context in requests:
            arguments = {"max_seq_length": context, "num_samples": num_samples, "random_seed": random_seed,
                         "template": prompt_template(task, template)}
            argv = generator_argv(task, save_dir=work / "out" / f"{task.name}_{context}", tokenizer_dir=tokenizer_dir,
                                  **arguments)
            placeholders = generator_argv(task, save_dir=Path("SAVE_DIR"), tokenizer_dir=Path("TOKENIZER"), **arguments)
            identity = {"argv": placeholders, "tokenizer": fingerprint}  # what the samples depend on, no temp paths
            key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
            cached = cache_dir / f"{task.name}_{context}_{key}.jsonl"
            if cached.is_file():
                out[(task.name, context)] = _samples_from_manifest(task, context, cached)
            else:
                jobs.append(_Job(task, context, argv, cached))
        errors = _run_jobs(jobs, work, timeout_s, workers) if jobs else {}
        for index, job in enumerate(jobs):
            if index in errors:
                failures[(job.task.name, job.context)] = errors[index]
                continue
            produced = work / "out" / f"{job.task.name}_{job.context}" / job.task.name / "validation.jsonl"
            cache_dir.mkdir(parents=True, exist_ok=True)
            save_text_atomically(job.cached, produced.read_text(encoding="utf-8"))
            out[(job.task.name, job.context)] = _samples_from_manifest(job.task, job.context, job.cached)
    for (name, context), samples in out.items():
        if len(samples) != num_samples:
            raise ValueError(f"RULER {name} at {context}: {len(samples)} samples generated, expected {num_samples}")
    return out, failures
