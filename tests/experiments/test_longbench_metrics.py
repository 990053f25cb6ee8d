"""LongBench metrics against hand-computed cases, including the original's quirks."""

from __future__ import annotations

import random

import pytest

from experiments.longbench.metrics import (
    classification_score,
    code_sim_score,
    count_score,
    first_line,
    fuzz_ratio,
    length_bucket,
    normalize_answer,
    qa_f1_score,
    retrieval_score,
    rouge_l_score,
    score_sample,
)

# ----------------------------------------------------------------------------- qa_f1


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The Eiffel Tower!", "eiffel tower"),
        ("an apple a day", "apple day"),
        ("the-end", "theend"),  # punctuation is removed before articles: no article left
        ("  Many   spaces\there ", "many spaces here"),
        ("Theatre", "theatre"),  # "the" only as a whole word
    ],
)
def test_normalize_answer(text, expected):
    assert normalize_answer(text) == expected


@pytest.mark.parametrize(
    ("prediction", "truth", "expected"),
    [
        ("The Eiffel Tower.", "eiffel tower", 1.0),
        ("Paris, France", "Paris", 2 / 3),  # P = 1/2, R = 1
        ("yes yes", "yes", 2 / 3),  # multiset overlap counts "yes" once
        ("the-band", "band", 0.0),  # "theband" != "band"
        ("a the an", "the", 0.0),  # both normalise to nothing: no overlap
        ("1,000 people", "1000", 2 / 3),  # the comma goes: "1000 people"
    ],
)
def test_qa_f1(prediction, truth, expected):
    assert qa_f1_score(prediction, truth) == pytest.approx(expected)


# ----------------------------------------------------------------------------- rouge-L


def test_rouge_l_counts_distinct_words():
    # LCS = "the cat on the mat" (5 tokens) but the package counts the distinct words {the, cat, on, mat}
    # and divides by 5 distinct words on each side: P = R = 4/5, F = 0.8 (textbook ROUGE-L: 5/6).
    score = rouge_l_score("the cat sat on the mat", "the cat lay on the mat")
    assert score == pytest.approx(0.8, abs=1e-7)


def test_rouge_l_splits_sentences_at_every_dot():
    # "arrived. Smith" is two sentences; each one's LCS with the reference adds a word: union = 2 of 2.
    assert rouge_l_score("arrived. Smith", "Smith arrived") == pytest.approx(1.0, abs=1e-7)
    # without the dot the LCS is one word: P = R = 1/2
    assert rouge_l_score("arrived Smith", "Smith arrived") == pytest.approx(0.5, abs=1e-7)


def test_rouge_l_whitespace_sentence_becomes_an_empty_word():
    # "cat. " -> sentences ["cat", ""]: the empty word counts in the prediction's vocabulary (n = 2).
    # P = 1/2, R = 1, F = 2/3.
    assert rouge_l_score("cat. ", "cat") == pytest.approx(2 / 3, abs=1e-7)


@pytest.mark.parametrize("prediction", ["", "...", "."])
def test_rouge_l_empty_prediction_scores_zero(prediction):
    assert rouge_l_score(prediction, "a reference summary") == 0.0


def test_rouge_l_matches_the_rouge_package():
    rouge = pytest.importorskip("rouge")
    scorer = rouge.Rouge()
    rng = random.Random(0)
    vocab = ["the", "cat", "sat", "mat", "on", "a", "dog", "ran", ".", "far", "away", "cat."]
    for _ in range(200):
        hyp = " ".join(rng.choice(vocab) for _ in range(rng.randint(1, 25)))
        ref = " ".join(rng.choice(vocab) for _ in range(rng.randint(1, 25)))
        try:
            expected = scorer.get_scores([hyp], [ref], avg=True)["rouge-l"]["f"]
        except ValueError:
            expected = 0.0
        assert rouge_l_score(hyp, ref) == pytest.approx(expected, abs=1e-12), (hyp, ref)


# ----------------------------------------------------------------------------- classification

CLASSES = ["Date", "City", "Food", "Letter", "like", "Letter like a-z"]


@pytest.mark.parametrize(
    ("prediction", "truth", "expected"),
    [
        ("City", "City", 1.0),
        ("Date or City", "City", 0.5),  # two classes named: partial credit 1/2
        ("Food", "City", 0.0),
        ("Cty", "City", 0.0),  # no class named: the original's similarity fallback is dead code
        # "Letter" (substring of the truth) is removed, which skips "like" in the same loop: 1/2, not 1
        ("Letter like a-z", "Letter like a-z", 0.5),
    ],
)
def test_classification(prediction, truth, expected):
    assert classification_score(prediction, truth, all_classes=CLASSES) == pytest.approx(expected)


def test_classification_needs_classes():
    with pytest.raises(ValueError, match="all_classes"):
        classification_score("City", "City", all_classes=[])


# ----------------------------------------------------------------------------- synthetic


@pytest.mark.parametrize(
    ("prediction", "expected"),
    [
        ("Paragraph 12", 1.0),
        ("Paragraph 12 and Paragraph 3", 0.5),
        ("Paragraph 121", 0.0),  # numbers compared whole, not as substrings
        ("paragraph twelve", 0.0),
    ],
)
def test_retrieval(prediction, expected):
    assert retrieval_score(prediction, "Paragraph 12") == pytest.approx(expected)


def test_retrieval_rejects_malformed_truth():
    with pytest.raises(ValueError, match="Paragraph N"):
        retrieval_score("1", "12")


@pytest.mark.parametrize(("prediction", "expected"), [("7", 1.0), ("7 unique of 10", 0.5), ("seven", 0.0)])
def test_count(prediction, expected):
    assert count_score(prediction, "7") == pytest.approx(expected)


# ----------------------------------------------------------------------------- code


def test_fuzz_ratio_hand_cases():
    assert fuzz_ratio("abcd", "abce") == 75  # 2·3 / 8
    assert fuzz_ratio("abbbbbbb", "accccccc") == 12  # 100·2/16 = 12.5 rounds half to even
    assert fuzz_ratio("", "x") == 0
    assert fuzz_ratio("", "") == 100  # equality is checked before emptiness


def test_fuzz_ratio_matches_fuzzywuzzy():
    fuzz = pytest.importorskip("fuzzywuzzy.fuzz")
    rng = random.Random(1)
    for _ in range(300):
        a = "".join(rng.choice("ab c=(x)") for _ in range(rng.randint(0, 30)))
        b = "".join(rng.choice("ab c=(x)") for _ in range(rng.randint(0, 30)))
        assert fuzz_ratio(a, b) == fuzz.ratio(a, b), (a, b)


@pytest.mark.parametrize(
    ("prediction", "truth", "expected"),
    [
        ("\n# comment\n    return x + 1\n", "    return x + 1", 1.0),
        ("```python\nx = 1", "x = 1", 1.0),
        ("x = a // b\ny = 2", "y = 2", 1.0),  # the floor-division line is skipped as a "comment"
        ("# only a comment", "x = 1", 0.0),
        ("abcd", "abce", 0.75),
    ],
)
def test_code_sim(prediction, truth, expected):
    assert code_sim_score(prediction, truth) == pytest.approx(expected)


# ----------------------------------------------------------------------------- per sample


def test_first_line_post_processing_only_where_longbench_does_it():
    assert first_line("\n\nParis\nis the answer") == "Paris"
    assert score_sample("triviaqa", "\n\nParis\nFrance", ["Paris"]) == 1.0
    assert score_sample("hotpotqa", "Paris\nFrance", ["Paris"]) == pytest.approx(2 / 3)


def test_score_is_max_over_answers():
    assert score_sample("hotpotqa", "Paris France", ["Paris", "Paris, France"]) == 1.0
    assert score_sample("hotpotqa", "Paris", []) == 0.0


def test_score_sample_rejects_bad_input():
    with pytest.raises(ValueError, match="unknown LongBench-E dataset"):
        score_sample("narrativeqa", "x", ["x"])
    with pytest.raises(ValueError, match="list of reference strings"):
        score_sample("hotpotqa", "x", "x")


@pytest.mark.parametrize(
    ("length", "bucket"), [(0, "0-4k"), (3999, "0-4k"), (4000, "4-8k"), (7999, "4-8k"), (8000, "8k+")]
)
def test_length_buckets(length, bucket):
    assert length_bucket(length) == bucket
