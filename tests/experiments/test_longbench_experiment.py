"""experiment=longbench end to end on the real-format fixture, with a tiny random Llama and a word tokenizer."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch

from experiments.io import ResultStore
from experiments.longbench import experiment as lb
from experiments.longbench.experiment import scored_line_complete
from experiments.longbench.prompts import DATASETS
from experiments.models import LoadedModel, ModelSpec

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "longbench"


@pytest.mark.parametrize(
    ("dataset", "text", "done"),
    [
        ("trec", "\n City", False),  # the first line may still grow
        ("trec", "\n City\nmore", True),
        ("lcc", "# a comment\n", False),  # a comment line is skipped by code_sim: keep going
        ("lcc", "# a comment\nx = 1\n", True),
        ("hotpotqa", "Paris\n", False),  # scored on the whole prediction: never stop early
    ],
)
def test_scored_line_complete(dataset, text, done):
    assert scored_line_complete(dataset, text) is done


def _tiny_model() -> LoadedModel:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    words = sorted({w for path in FIXTURE.glob("*.jsonl") for w in path.read_text().split()})
    vocab = {w: i for i, w in enumerate(["[UNK]", "[EOS]", "[PAD]", *words[:500]])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", eos_token="[EOS]", pad_token="[PAD]")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(vocab), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=4096)
    model = LlamaForCausalLM(config).eval()
    spec = ModelSpec(name="tiny", display_name="tiny random Llama", pretrained="unused")
    return LoadedModel(model=model, tokenizer=tokenizer, spec=spec, provenance={"model": "tiny"})


@pytest.fixture
def cfg():
    from hydra import compose, initialize_config_dir

    overrides = [
        "experiment=longbench",
        "longbench_data=local",
        f"longbench_data.path={FIXTURE}",
        "experiment.sizes.quick.samples_per_dataset=1",
        "experiment.sizes.quick.max_length=64",
        "experiment.sizes.quick.max_new_tokens_cap=3",
        "~experiment.methods.kivi_3bit",
        "~experiment.methods.kivi_5bit",
        "~experiment.methods.polarquant",
        "~experiment.methods.turboquant_2p5_window",
        "~experiment.methods.turboquant_3p5_window_centered",
        "experiment.methods.turboquant_3p5_window.options.residual_length=0",  # fixture prompts < 128 tokens
    ]
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        return compose("config", overrides=overrides)


def test_longbench_runs_resumes_and_tabulates(cfg, tmp_path, monkeypatch):
    loaded = _tiny_model()
    monkeypatch.setattr(lb, "load_model", lambda spec, device: loaded)
    store = ResultStore(tmp_path, "longbench", cfg, result_keys=lb.RESULT_KEYS)
    frame = lb.run(cfg, store)
    assert len(frame) == 2 * len(DATASETS)
    assert set(frame["method"]) == {"full", "turboquant_3p5_window"}
    assert frame["score"].between(0, 1).all() and (frame["new_tokens"] <= 3).all()
    assert frame.loc[frame["method"] == "turboquant_3p5_window", "memory_ratio"].lt(1).all()

    tables = lb.tables(frame)
    assert list(tables["table"].index) == ["full", "turboquant_3p5_window"]
    assert tables["table"].loc["full", "delta_vs_full"] == 0
    expected = frame[frame["method"] == "full"].groupby("task")["score"].mean().mean() * 100
    assert tables["table"].loc["full", "Average"] == pytest.approx(expected)
    text = next(store.directory.glob(f"summary_{frame['model'].iloc[0]}*.md")).read_text()
    assert "tiny random Llama" in text and "THUDM/LongBench (LongBench-E)" in text

    comparison = {row["id"]: row["value"] for row in lb.paper_comparison(frame)}
    assert comparison["longbench.avg_delta.turboquant_3.5"] == pytest.approx(
        tables["table"].loc["turboquant_3p5_window", "Average"] - tables["table"].loc["full", "Average"]
    )
    assert "longbench.average.turboquant_3.5" in comparison  # real-format data: absolute rows too

    # a second run finds every sample done and generates nothing
    monkeypatch.setattr(lb, "generate", lambda *a, **k: pytest.fail("resumed run must not decode"))
    again = lb.run(cfg, ResultStore(tmp_path, "longbench", cfg, result_keys=lb.RESULT_KEYS))
    pd.testing.assert_frame_equal(again.sort_values("unit_id").reset_index(drop=True),
                                  frame.sort_values("unit_id").reset_index(drop=True))
    assert lb.plot(frame, cfg, tmp_path / "figures")


def test_all_pairs_difference_uses_every_sample_a_method_shares_with_full():
    """``delta_all_pairs`` pairs each method with the full cache on all their common samples, so a third method
    with fewer samples lowers the paired columns' counts (``delta_vs_full``) but not its own pairs."""
    rows = []
    for task in DATASETS:
        for sample in range(4):
            base = 0.5 + 0.1 * (sample % 2)
            rows.append({"task": task, "sample_id": sample, "method": "full", "score": base})
            rows.append({"task": task, "sample_id": sample, "method": "a", "score": base - 0.1 * (sample == 3)})
            if sample < 2:
                rows.append({"task": task, "sample_id": sample, "method": "b", "score": base})
    frame = pd.DataFrame(rows).assign(prediction="x", length_bucket="0-4k", method_label=lambda d: d["method"],
                                      paper_method=lambda d: d["method"])
    table = lb.tables(frame)["table"]
    assert table.loc["a", "delta_vs_full"] == pytest.approx(0.0)  # samples 0-1 only: where b has scores
    assert table.loc["a", "delta_all_pairs"] == pytest.approx(-100 * 0.1 / 4)  # sample 3 of 4 lost 0.1
    assert table.loc["a", "pairs"] == 4 * len(DATASETS) and table.loc["b", "pairs"] == 2 * len(DATASETS)
    assert table.loc["a", "delta_se_all_pairs"] > 0 and table.loc["b", "delta_all_pairs"] == 0


def test_paper_rows_pair_each_method_with_full_on_its_own_samples():
    """A paper row's difference is the method's own paired difference with the full cache: a slow method with few
    samples (here ``kivi``, 1 per dataset) does not cut the others' rows to its samples."""
    rows = []
    for task in DATASETS:
        for sample in range(4):
            base = 0.5 + 0.1 * (sample % 2)
            rows.append({"task": task, "sample_id": sample, "method": "full", "score": base, "paper_method": "full"})
            rows.append({"task": task, "sample_id": sample, "method": "tq", "score": base - 0.1 * (sample == 3),
                         "paper_method": "turboquant_3.5"})
            if sample == 0:
                rows.append({"task": task, "sample_id": sample, "method": "kivi", "score": base,
                             "paper_method": "kivi3"})
    frame = pd.DataFrame(rows).assign(prediction="x", length_bucket="0-4k", method_label=lambda d: d["method"],
                                      max_length=8000, max_new_tokens_cap=128, data_source="embedded",
                                      model_label="m", data="d")
    out = {row["id"]: row for row in lb.paper_comparison(frame)}
    tq = out["longbench.avg_delta.turboquant_3.5"]
    assert tq["value"] == pytest.approx(-100 * 0.1 / 4) and tq["se"] > 0  # all 4 samples, not kivi's 1
    assert f"{4 * len(DATASETS)} samples paired with the full cache, 4-4 per dataset" in tq["detail"]
    assert out["longbench.avg_delta.kivi3"]["value"] == 0
