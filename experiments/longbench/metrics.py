"""LongBench's scoring functions, re-implemented from the public spec (THUDM/LongBench ``metrics.py``).

Each ``*_score(prediction, ground_truth, all_classes=...)`` returns a float in [0, 1] for one
(prediction, reference answer) pair; :func:`score_sample` applies the dataset's post-processing and
takes the max over the sample's reference answers, exactly as LongBench's ``eval.py`` does.

The quirks of the original are reproduced on purpose, because they move the numbers:

* ``qa_f1``: SQuAD-style ``normalize_answer`` (lower-case, drop ASCII punctuation, drop the words
  a/an/the, collapse whitespace), then bag-of-tokens F1 (multiset overlap).
* ``rouge``: ROUGE-L F of the ``rouge`` package (pltrdy, 1.0.1) with its defaults, which is *not* the
  textbook ROUGE-L: texts are cut into "sentences" at every ``.``; the summary-level union-LCS is
  taken over *sets* of words (``exclusive=True``), so the union counts distinct words and the
  denominators are the numbers of *distinct* words; F = 2PR / (P + R + 1e-8). An empty prediction
  (or one made only of dots) raises inside the package and LongBench scores it 0. Implemented here
  without the package (no dependency), with its backtracking order so the same LCS is chosen;
  ``tests/experiments/test_longbench_metrics.py`` checks it against the package when installed.
  One difference is deliberate: the package's recursive backtracking overflows Python's stack on a
  dot-free sentence pair longer than roughly 1,000 words, which LongBench's bare ``except`` turns
  into a score of 0; this iterative version scores such pairs normally.
* ``classification`` (trec): every class name that occurs as a substring of the prediction is a
  match; matches that are substrings of the ground truth (but not equal to it) are then removed
  *while iterating over the same list*, which skips the element after each removal — reproduced.
  Score = 1/len(matches) if the ground truth is among the matches, else 0. (The original's fallback
  to the most similar class is dead code: it tests ``list != 0``, always true.)
* ``retrieval`` (passage_retrieval_en): the paragraph number N of the ground truth "Paragraph N";
  score = (numbers in the prediction equal to N) / (numbers in the prediction), 0 with no numbers.
* ``count`` (passage_count): the same fraction, against the ground-truth count.
* ``code_sim`` (lcc, repobench-p): the first line of the prediction (leading newlines stripped) that
  contains none of a backtick, ``#`` or ``//`` (``""`` if there is none), compared to the reference with
  fuzzywuzzy's ``fuzz.ratio`` / 100. Pure-Python fuzzywuzzy (LongBench's requirements do not pull
  python-Levenshtein) computes ``round(100 * difflib.SequenceMatcher(None, a, b).ratio())`` with two
  guards: equal strings give 100 and an empty string gives 0 — reproduced with :mod:`difflib`
  (identical to ``fuzzywuzzy.fuzz.ratio`` without python-Levenshtein; rapidfuzz / thefuzz differ).
"""

from __future__ import annotations

import difflib
import re
import string
from collections import Counter
from collections.abc import Callable, Sequence

__all__ = [
    "normalize_answer",
    "qa_f1_score",
    "rouge_l_score",
    "classification_score",
    "retrieval_score",
    "count_score",
    "code_sim_score",
    "fuzz_ratio",
    "first_line",
    "FIRST_LINE_DATASETS",
    "DATASET_METRIC",
    "METRICS",
    "score_sample",
    "length_bucket",
    "LENGTH_BUCKETS",
]

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)
_NUMBER = re.compile(r"\d+")
_PARAGRAPH_ID = re.compile(r"Paragraph (\d+)")


# --------------------------------------------------------------------------- qa_f1
def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower-case, remove punctuation, remove articles, collapse whitespace.

    The order matters and is LongBench's: punctuation goes before articles, so "the-end" becomes
    "theend" (no article left) while "the end" becomes "end".
    """
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _bag_f1(prediction_tokens: Sequence[str], reference_tokens: Sequence[str]) -> float:
    """F1 of the multiset overlap: P = |p ∩ r| / |p|, R = |p ∩ r| / |r|, F1 = 2PR / (P + R)."""
    overlap = sum((Counter(prediction_tokens) & Counter(reference_tokens)).values())
    if overlap == 0:
        return 0.0
    precision = overlap / len(prediction_tokens)
    recall = overlap / len(reference_tokens)
    return 2 * precision * recall / (precision + recall)


def qa_f1_score(prediction: str, ground_truth: str, **_: object) -> float:
    """Token F1 between the normalised prediction and reference (qasper, multifieldqa_en, hotpotqa,
    2wikimqa, triviaqa)."""
    return _bag_f1(normalize_answer(prediction).split(), normalize_answer(ground_truth).split())


# --------------------------------------------------------------------------- rouge-L
def _rouge_sentences(text: str) -> list[str]:
    """The ``rouge`` package's sentence split: cut at every ".", keep non-empty pieces, squash spaces.

    A piece made only of whitespace is kept (it is non-empty before squashing) and becomes "", which
    later counts as one (empty) word — as in the package.
    """
    return [" ".join(piece.split()) for piece in text.split(".") if len(piece) > 0]


def _lcs_words(reference: Sequence[str], candidate: Sequence[str]) -> set[str]:
    """Words of one longest common subsequence, chosen by the package's backtracking rule.

    The DP table is the textbook one; the walk back from (len(reference), len(candidate)) takes a
    diagonal step on a match, else moves up when table[i-1][j] > table[i][j-1] and left otherwise.
    """
    n, m = len(reference), len(candidate)
    table = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(1, n + 1):
        row, previous = table[i], table[i - 1]
        word = reference[i - 1]
        for j in range(1, m + 1):
            row[j] = previous[j - 1] + 1 if word == candidate[j - 1] else max(previous[j], row[j - 1])
    words: set[str] = set()
    i, j = n, m
    while i > 0 and j > 0:
        if reference[i - 1] == candidate[j - 1]:
            words.add(reference[i - 1])
            i, j = i - 1, j - 1
        elif table[i - 1][j] > table[i][j - 1]:
            i -= 1
        else:
            j -= 1
    return words


def rouge_l_score(prediction: str, ground_truth: str, **_: object) -> float:
    """ROUGE-L F as LongBench gets it from ``Rouge().get_scores(...)["rouge-l"]["f"]`` (gov_report,
    multi_news, samsum).

    With C the prediction's sentences and R the reference's:
    LCS_u = |⋃_{r∈R, c∈C} words(LCS(r, c))| (a set: distinct words), P = LCS_u / |distinct words of C|,
    R = LCS_u / |distinct words of R|, F = 2PR / (P + R + 1e-8). Empty prediction or reference: 0.
    """
    hypothesis = _rouge_sentences(prediction)
    reference = _rouge_sentences(ground_truth)
    if not hypothesis or not reference:
        return 0.0  # the package raises ValueError; LongBench's bare except returns 0.0
    hypothesis_words = [sentence.split(" ") for sentence in hypothesis]
    reference_words = [sentence.split(" ") for sentence in reference]
    n_hypothesis = len({w for words in hypothesis_words for w in words})
    n_reference = len({w for words in reference_words for w in words})
    union: set[str] = set()
    for ref in reference_words:
        for hyp in hypothesis_words:
            union |= _lcs_words(ref, hyp)
    recall = len(union) / n_reference
    precision = len(union) / n_hypothesis
    return 2.0 * (precision * recall) / (precision + recall + 1e-8)


# --------------------------------------------------------------------------- classification
def classification_score(prediction: str, ground_truth: str, *, all_classes: Sequence[str], **_: object) -> float:
    """trec: 1/len(matches) when the ground-truth class is among the class names found in the prediction.

    Matches that are proper substrings of the ground truth are dropped, with the original's
    skip-after-removal iteration (see the module docstring).
    """
    if not all_classes:
        raise ValueError("classification_score needs the dataset's all_classes (got none)")
    matches = [name for name in all_classes if name in prediction]
    index = 0
    while index < len(matches):  # a for-loop over a list that is shrunk inside it, spelled out
        term = matches[index]
        if term in ground_truth and term != ground_truth:
            matches.remove(term)
        index += 1
    if ground_truth in matches:
        return 1.0 / len(matches)
    return 0.0


# --------------------------------------------------------------------------- synthetic
def _fraction_of_numbers_equal(prediction: str, target: str) -> float:
    numbers = _NUMBER.findall(prediction)
    if not numbers:
        return 0.0
    return sum(number == target for number in numbers) / len(numbers)


def retrieval_score(prediction: str, ground_truth: str, **_: object) -> float:
    """passage_retrieval_en: share of the numbers in the prediction equal to the N of "Paragraph N"."""
    match = _PARAGRAPH_ID.search(ground_truth)
    if match is None:
        raise ValueError(f"retrieval ground truth must look like 'Paragraph N', got {ground_truth!r}")
    return _fraction_of_numbers_equal(prediction, match.group(1))


def count_score(prediction: str, ground_truth: str, **_: object) -> float:
    """passage_count: share of the numbers in the prediction equal to the true count."""
    return _fraction_of_numbers_equal(prediction, str(ground_truth))


# --------------------------------------------------------------------------- code
def fuzz_ratio(a: str, b: str) -> int:
    """fuzzywuzzy's ``fuzz.ratio`` (pure Python): round(100 · difflib ratio), 100 if equal, 0 if one is empty.

    difflib's ratio is 2M/T with M the matched characters of its Ratcliff-Obershelp matching blocks and
    T = len(a) + len(b); ``round`` is Python's (banker's) rounding, as in ``fuzzywuzzy.utils.intr``.
    """
    if a == b:
        return 100
    if not a or not b:
        return 0
    return int(round(100 * difflib.SequenceMatcher(None, a, b).ratio()))


def code_sim_score(prediction: str, ground_truth: str, **_: object) -> float:
    """lcc / repobench-p: edit similarity of the first code-looking line of the prediction."""
    candidate = ""
    for line in prediction.lstrip("\n").split("\n"):
        if "`" not in line and "#" not in line and "//" not in line:
            candidate = line
            break
    return fuzz_ratio(candidate, ground_truth) / 100


# --------------------------------------------------------------------------- per dataset
METRICS: dict[str, Callable[..., float]] = {
    "qa_f1": qa_f1_score,
    "rouge": rouge_l_score,
    "classification": classification_score,
    "retrieval": retrieval_score,
    "count": count_score,
    "code_sim": code_sim_score,
}

#: LongBench's dataset2metric for the 13 LongBench-E English datasets.
DATASET_METRIC: dict[str, str] = {
    "qasper": "qa_f1",
    "multifieldqa_en": "qa_f1",
    "hotpotqa": "qa_f1",
    "2wikimqa": "qa_f1",
    "gov_report": "rouge",
    "multi_news": "rouge",
    "trec": "classification",
    "triviaqa": "qa_f1",
    "samsum": "rouge",
    "passage_count": "count",
    "passage_retrieval_en": "retrieval",
    "lcc": "code_sim",
    "repobench-p": "code_sim",
}

#: Datasets whose prediction is cut to its first line before scoring (LongBench eval.py; lsht is Chinese).
FIRST_LINE_DATASETS: frozenset[str] = frozenset({"trec", "triviaqa", "samsum", "lsht"})


def first_line(prediction: str) -> str:
    """LongBench's post-processing: strip leading newlines, keep the first line."""
    return prediction.lstrip("\n").split("\n")[0]


def score_sample(
    dataset: str,
    prediction: str,
    answers: Sequence[str],
    all_classes: Sequence[str] | None = None,
) -> float:
    """One sample's score in [0, 1]: post-process, then the max of the metric over the reference answers.

    Starts from 0 like the original, so a sample with no answers scores 0.
    """
    if dataset not in DATASET_METRIC:
        raise ValueError(f"unknown LongBench-E dataset {dataset!r}; known: {sorted(DATASET_METRIC)}")
    if isinstance(answers, str):
        raise ValueError("answers must be a list of reference strings, not one string")
    if dataset in FIRST_LINE_DATASETS:
        prediction = first_line(prediction)
    metric = METRICS[DATASET_METRIC[dataset]]
    best = 0.0
    for answer in answers:
        best = max(best, metric(prediction, answer, all_classes=all_classes or ()))
    return best


# --------------------------------------------------------------------------- LongBench-E length buckets
#: LongBench-E's buckets over the sample's ``length`` field (words of input + context + answers).
LENGTH_BUCKETS: tuple[str, ...] = ("0-4k", "4-8k", "8k+")


def length_bucket(length: int) -> str:
    """"0-4k" if length < 4000, "4-8k" if length < 8000, else "8k+" (LongBench eval.py ``scorer_e``)."""
    if length < 0:
        raise ValueError(f"length must be non-negative, got {length}")
    if length < 4000:
        return "0-4k"
    if length < 8000:
        return "4-8k"
    return "8k+"
