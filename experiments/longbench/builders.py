"""LongBench-style tasks built from real shipped text and code (the embedded, offline default).

These are substitutes, never LongBench: each of the 13 LongBench-E datasets gets a task of the same
shape (same prompt template, answer form and metric) built from real data that ships offline
(:mod:`experiments.longbench.sources`). What stands in for what:

==================== =====================================================================================
dataset              LongBench-style substitute
==================== =====================================================================================
qasper               SQuAD v2.0 question over its Wikipedia article (the question's paragraph + other
                     paragraphs of the same article, in article order); unanswerable v2 questions are
                     answered "unanswerable", as qasper's are
multifieldqa_en      answerable SQuAD v2.0 question; its paragraph hidden among paragraphs of other articles
hotpotqa             HotpotQA bridge question: its 10 gold + distractor paragraphs, padded with paragraphs of
                     other questions, shuffled, as "Passage i:\\n<title>\\n<text>"
2wikimqa             HotpotQA comparison question (2WikiMQA's dominant type), built the same way
gov_report           long Wikipedia article → its lead: the body (SQuAD paragraphs 2..n) is the "report",
                     the article's first paragraph the reference summary
multi_news           several Wikipedia intros without their lead sentences → the lead sentences (XSum's
                     construction: the summary is the sentence taken out of the document)
trec                 few-shot classification of SQuAD questions into the Wikipedia article they were
                     written about (35 classes)
triviaqa             few-shot SQuAD reading comprehension ("Passage / Question / Answer" examples)
samsum               few-shot lead-sentence summarisation of Wikipedia intros
passage_count        Wikipedia intros, some repeated, shuffled: count the distinct ones
passage_retrieval_en Wikipedia intros; the "abstract" is one intro's lead sentence: which paragraph?
lcc                  next line of a CPython standard-library file from the lines before it
repobench-p          next line of a stdlib file that uses a name imported from another stdlib module, with
                     that module's definitions in the context ("# Path: ..." headers, as repobench-p)
==================== =====================================================================================

Every sample is deterministic in (seed, dataset, index) and independent of how many samples are asked for,
so raising the sample cap only appends samples. Context lengths follow a per-sample token budget measured
with the caller's ``count_tokens`` (the model's tokenizer in the experiment); LongBench's middle truncation
is applied later, at prompt time (:func:`experiments.longbench.prompts.truncate_middle`).
"""

from __future__ import annotations

import ast
import functools
import itertools
import random
import re
from collections.abc import Callable, Iterable, Sequence

from experiments.longbench.prompts import DATASETS
from experiments.longbench.sample import LongBenchSample, word_length
from experiments.longbench.sources import (
    HotpotQuestion,
    PythonFile,
    hotpotqa_questions,
    squad_articles,
    stdlib_files,
    wikipedia_paragraphs,
)

__all__ = ["TokenCounter", "whitespace_tokens", "SUBSTITUTES", "build_samples"]

TokenCounter = Callable[[str], int]

#: One line per dataset: what the embedded task is (goes into configs, tables and provenance).
SUBSTITUTES: dict[str, str] = {
    "qasper": "SQuAD v2.0 question over its Wikipedia article (unanswerable -> 'unanswerable')",
    "multifieldqa_en": "SQuAD v2.0 question, its paragraph among other articles' paragraphs",
    "hotpotqa": "HotpotQA dev bridge questions, gold + distractor paragraphs padded",
    "2wikimqa": "HotpotQA dev comparison questions, gold + distractor paragraphs padded",
    "gov_report": "Wikipedia article body (SQuAD v2.0 dev) -> its lead paragraph",
    "multi_news": "Wikipedia intros without lead sentences (HotpotQA) -> the lead sentences",
    "trec": "few-shot SQuAD question -> source article classification (35 classes)",
    "triviaqa": "few-shot SQuAD v2.0 reading comprehension",
    "samsum": "few-shot lead-sentence summarisation of Wikipedia intros (HotpotQA)",
    "passage_count": "distinct Wikipedia intros (HotpotQA) among repeats",
    "passage_retrieval_en": "which Wikipedia intro (HotpotQA) a lead sentence comes from",
    "lcc": "next line of a CPython standard-library file",
    "repobench-p": "next line of a stdlib file using a name imported from another stdlib module",
}


def whitespace_tokens(text: str) -> int:
    """A tokenizer-free length: whitespace-separated words (tests; the experiment uses the model's tokenizer)."""
    return len(text.split())


# --------------------------------------------------------------------------- shared helpers
def _rng(seed: int, dataset: str, index: int) -> random.Random:
    return random.Random(f"longbench-style:{seed}:{dataset}:{index}")


def _pick(pool: Sequence, seed: int, dataset: str, index: int):
    """Sample ``index`` of a dataset takes element ``perm[index % len(pool)]`` of a seeded permutation."""
    order = list(range(len(pool)))
    random.Random(f"longbench-style-order:{seed}:{dataset}").shuffle(order)
    return pool[order[index % len(order)]]


def _fill(required: Sequence[str], optional: Iterable[str], budget: int, count_tokens: TokenCounter) -> list[str]:
    """``required`` pieces plus optional ones, in the order given, while the total stays within ``budget``."""
    chosen = list(required)
    used = sum(count_tokens(piece) for piece in chosen)
    for piece in optional:
        cost = count_tokens(piece)
        if used + cost > budget:
            break
        chosen.append(piece)
        used += cost
    return chosen


def _others(pool: Sequence, rng: random.Random, exclude: set) -> Iterable:
    """Random elements of ``pool`` not in ``exclude`` (by identity of the element), without repeats."""
    order = list(range(len(pool)))
    rng.shuffle(order)
    for i in order:
        if pool[i] not in exclude:
            yield pool[i]


def _sample(dataset: str, seed: int, index: int, input_text: str, context: str, answers: Sequence[str],
            all_classes: Sequence[str] = ()) -> LongBenchSample:
    return LongBenchSample(
        dataset=dataset,
        sample_id=f"{dataset}-s{seed}-{index}",
        input=input_text,
        context=context,
        answers=tuple(answers),
        length=word_length(input_text, context, answers),
        all_classes=tuple(all_classes),
    )


def _intro(sentences: Sequence[str]) -> str:
    return "".join(sentences).strip()


def _lead_and_body(sentences: Sequence[str]) -> tuple[str, str]:
    return sentences[0].strip(), "".join(sentences[1:]).strip()


@functools.lru_cache(maxsize=4)
def _multi_sentence_paragraphs(min_sentences: int = 3) -> list[tuple[str, tuple[str, ...]]]:
    return [p for p in wikipedia_paragraphs() if len(p[1]) >= min_sentences]


# --------------------------------------------------------------------------- QA
def _hotpot_passages(question: HotpotQuestion, rng: random.Random, budget: int, count: TokenCounter) -> str:
    """Gold paragraphs, then the question's own distractors, then other questions' paragraphs, within budget."""
    gold = [f"{t}\n{_intro(s)}" for t, s in question.paragraphs if t in question.supporting_titles]
    distractors = [f"{t}\n{_intro(s)}" for t, s in question.paragraphs if t not in question.supporting_titles]
    rng.shuffle(distractors)
    titles = {title for title, _ in question.paragraphs}
    padding = (f"{t}\n{_intro(s)}" for t, s in _others(wikipedia_paragraphs(), rng, set()) if t not in titles)
    pieces = _fill(gold, itertools.chain(distractors, padding), budget, count)
    rng.shuffle(pieces)
    return "".join(f"Passage {i}:\n{piece}\n" for i, piece in enumerate(pieces, start=1))


def _build_hotpot(kind: str, dataset: str):
    def build(seed: int, index: int, budget: int, count: TokenCounter) -> LongBenchSample:
        pool = [q for q in hotpotqa_questions() if q.kind == kind]
        question = _pick(pool, seed, dataset, index)
        context = _hotpot_passages(question, _rng(seed, dataset, index), budget, count)
        return _sample(dataset, seed, index, question.question, context, [question.answer])

    return build


@functools.lru_cache(maxsize=2)
def _squad_items(answerable_only: bool) -> list[tuple[int, int, int]]:
    """(article, paragraph, question) indices of SQuAD v2.0 dev questions."""
    return [
        (a, p, q)
        for a, article in enumerate(squad_articles())
        for p, qs in enumerate(article.questions)
        for q, question in enumerate(qs)
        if question.answers or not answerable_only
    ]


def _build_qasper(seed: int, index: int, budget: int, count: TokenCounter) -> LongBenchSample:
    a, p, q = _pick(_squad_items(answerable_only=False), seed, "qasper", index)
    article = squad_articles()[a]
    question = article.questions[p][q]
    rng = _rng(seed, "qasper", index)
    others = [i for i in range(len(article.paragraphs)) if i != p]
    rng.shuffle(others)
    kept = _fill([p], others, budget, lambda i: count(article.paragraphs[i]))
    context = "\n\n".join(article.paragraphs[i] for i in sorted(kept))
    answers = question.answers or ("unanswerable",)
    return _sample("qasper", seed, index, question.question, f"{article.title}\n\n{context}", answers)


def _build_multifieldqa(seed: int, index: int, budget: int, count: TokenCounter) -> LongBenchSample:
    a, p, q = _pick(_squad_items(answerable_only=True), seed, "multifieldqa_en", index)
    article = squad_articles()[a]
    question = article.questions[p][q]
    rng = _rng(seed, "multifieldqa_en", index)
    foreign = [para for i, art in enumerate(squad_articles()) if i != a for para in art.paragraphs]
    pieces = _fill([article.paragraphs[p]], _others(foreign, rng, set()), budget, count)
    rng.shuffle(pieces)
    return _sample("multifieldqa_en", seed, index, question.question, "\n\n".join(pieces), question.answers)


# --------------------------------------------------------------------------- summarisation
def _build_gov_report(seed: int, index: int, budget: int, count: TokenCounter) -> LongBenchSample:
    article = _pick(squad_articles(), seed, "gov_report", index)
    lead, body = article.paragraphs[0], article.paragraphs[1:]
    kept = _fill(body[:1], body[1:], budget, count)
    return _sample("gov_report", seed, index, "", "\n\n".join(kept), [lead])


def _build_multi_news(seed: int, index: int, budget: int, count: TokenCounter) -> LongBenchSample:
    pool = _multi_sentence_paragraphs()
    first = _pick(pool, seed, "multi_news", index)
    rng = _rng(seed, "multi_news", index)
    docs = _fill([first], _others(pool, rng, {first}), budget, lambda p: count(_lead_and_body(p[1])[1]))
    leads, bodies = zip(*(_lead_and_body(sents) for _, sents in docs), strict=True)
    context = "\n\n".join(f"Document {i}:\n{body}" for i, body in enumerate(bodies, start=1))
    return _sample("multi_news", seed, index, "", context, [" ".join(leads)])


# --------------------------------------------------------------------------- few-shot
def _build_trec(seed: int, index: int, budget: int, count: TokenCounter) -> LongBenchSample:
    items = _squad_items(answerable_only=False)
    articles = squad_articles()
    a, p, q = _pick(items, seed, "trec", index)
    rng = _rng(seed, "trec", index)
    shots = (
        f"Question: {articles[i].questions[j][k].question}\nType: {articles[i].title}\n"
        for i, j, k in _others(items, rng, {(a, p, q)})
    )
    context = "".join(_fill([], shots, budget, count))
    classes = [article.title for article in articles]
    question = articles[a].questions[p][q].question
    return _sample("trec", seed, index, f"Question: {question}\nType:", context, [articles[a].title], classes)


def _build_triviaqa(seed: int, index: int, budget: int, count: TokenCounter) -> LongBenchSample:
    items = _squad_items(answerable_only=True)
    articles = squad_articles()
    a, p, q = _pick(items, seed, "triviaqa", index)
    rng = _rng(seed, "triviaqa", index)
    test = articles[a].questions[p][q]
    query = f"Passage: {articles[a].paragraphs[p]}\nQuestion: {test.question}\nAnswer:"
    shots = (
        f"Passage: {articles[i].paragraphs[j]}\nQuestion: {articles[i].questions[j][k].question}\n"
        f"Answer: {articles[i].questions[j][k].answers[0]}\n\n"
        for i, j, k in _others(items, rng, {(a, p, q)})
        if j != p or i != a
    )
    context = "".join(_fill([], shots, max(budget - count(query), 0), count)).rstrip("\n")
    return _sample("triviaqa", seed, index, query, context, test.answers)


def _build_samsum(seed: int, index: int, budget: int, count: TokenCounter) -> LongBenchSample:
    pool = _multi_sentence_paragraphs()
    target = _pick(pool, seed, "samsum", index)
    rng = _rng(seed, "samsum", index)
    lead, body = _lead_and_body(target[1])
    query = f"Passage: {body}\nSummary:"

    def shot(paragraph: tuple[str, tuple[str, ...]]) -> str:
        shot_lead, shot_body = _lead_and_body(paragraph[1])
        return f"Passage: {shot_body}\nSummary: {shot_lead}\n\n"

    shots = (shot(p) for p in _others(pool, rng, {target}))
    context = "".join(_fill([], shots, max(budget - count(query), 0), count)).rstrip("\n")
    return _sample("samsum", seed, index, query, context, [lead])


# --------------------------------------------------------------------------- synthetic
def _numbered(paragraphs: Sequence[str]) -> str:
    return "\n\n".join(f"Paragraph {i}: {text}" for i, text in enumerate(paragraphs, start=1))


def _build_passage_count(seed: int, index: int, budget: int, count: TokenCounter) -> LongBenchSample:
    pool = wikipedia_paragraphs()
    first = _pick(pool, seed, "passage_count", index)
    rng = _rng(seed, "passage_count", index)
    unique_budget = int(budget * rng.uniform(0.4, 0.8))
    unique = _fill([_intro(first[1])], (_intro(s) for _, s in _others(pool, rng, {first})), unique_budget, count)
    repeats = (rng.choice(unique) for _ in range(10 * len(unique) + 10))
    shown = _fill(unique, repeats, budget, count)
    rng.shuffle(shown)
    return _sample("passage_count", seed, index, "", _numbered(shown), [str(len(set(shown)))])


def _build_passage_retrieval(seed: int, index: int, budget: int, count: TokenCounter) -> LongBenchSample:
    pool = _multi_sentence_paragraphs(min_sentences=2)
    target = _pick(pool, seed, "passage_retrieval_en", index)
    rng = _rng(seed, "passage_retrieval_en", index)
    texts = _fill([_intro(target[1])], (_intro(s) for _, s in _others(pool, rng, {target})), budget, count)
    rng.shuffle(texts)
    position = texts.index(_intro(target[1])) + 1
    abstract = target[1][0].strip()
    return _sample("passage_retrieval_en", seed, index, abstract, _numbered(texts), [f"Paragraph {position}"])


# --------------------------------------------------------------------------- code
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _is_code_line(line: str) -> bool:
    """A next-line target: real code, not blank, comment, docstring/string line or lone bracket."""
    text = line.strip()
    return len(text) >= 8 and not text.startswith(("#", '"', "'", ")", "]", "}")) and not text.startswith("@")


def _head_within(text: str, budget: int, count: TokenCounter) -> str:
    """The longest head of ``text`` (whole lines, at least one) within ``budget`` tokens."""
    kept: list[str] = []
    used = 0
    for line in text.split("\n"):
        cost = count(line + "\n")
        if kept and used + cost > budget:
            break
        kept.append(line)
        used += cost
    return "\n".join(kept)


def _prefix_within(lines: Sequence[str], budget: int, count: TokenCounter) -> str:
    """The longest tail of ``lines`` (whole lines) within ``budget`` tokens, newline-terminated."""
    kept: list[str] = []
    used = 0
    for line in reversed(lines):
        cost = count(line + "\n")
        if kept and used + cost > budget:
            break
        kept.append(line)
        used += cost
    return "\n".join(reversed(kept)) + "\n"


def _build_lcc(seed: int, index: int, budget: int, count: TokenCounter) -> LongBenchSample:
    pool = [f for f in stdlib_files() if len(f.lines) >= 60]
    rng = _rng(seed, "lcc", index)
    # the next file of the seeded order when a file has no code line past its first 30 (a data table)
    for step in range(len(pool)):
        source = _pick(pool, seed, "lcc", index + step)
        cuts = [i for i in range(30, len(source.lines)) if _is_code_line(source.lines[i])]
        if cuts:
            break
    else:
        raise ValueError("no shipped Python file has a code line to complete")
    cut = rng.choice(cuts)
    context = _prefix_within(source.lines[:cut], budget, count)
    return _sample("lcc", seed, index, "", context, [source.lines[cut].strip()])


def _imported_names(source: PythonFile, modules: dict[str, PythonFile]) -> dict[str, PythonFile]:
    """Names bound by top-level ``from M import n`` where M is another stdlib file we have."""
    try:
        tree = ast.parse("\n".join(source.lines))
    except (SyntaxError, ValueError):  # a file of another Python version's grammar
        return {}
    names: dict[str, PythonFile] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in modules:
            target = modules[node.module]
            if target.relpath == source.relpath:
                continue
            for alias in node.names:
                if alias.name != "*":
                    names[alias.asname or alias.name] = target
    return names


def _definition_snippets(module: PythonFile, wanted: set[str]) -> list[str]:
    """Source of the top-level defs/classes/assignments of ``module`` that bind a name in ``wanted``."""
    text = "\n".join(module.lines)
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return []
    snippets = []
    for node in tree.body:
        bound = {getattr(node, "name", None)}
        if isinstance(node, ast.Assign):
            bound = {t.id for t in node.targets if isinstance(t, ast.Name)}
        if bound & wanted:
            snippets.append(ast.get_source_segment(text, node) or "")
    return [s for s in snippets if s]


@functools.lru_cache(maxsize=1)
def _cross_file_candidates() -> tuple[tuple[PythonFile, dict[str, PythonFile]], ...]:
    """Stdlib files with at least one name imported from another stdlib file, with those names."""
    files = stdlib_files()
    modules = {f.module: f for f in files}
    pairs = ((source, _imported_names(source, modules)) for source in files)
    return tuple((source, imported) for source, imported in pairs if imported)


def _repobench_cuts(source: PythonFile, imported: dict[str, PythonFile]) -> list[int]:
    """Lines (after the first 10) a completion may be asked for: code lines that use an imported name, else
    (names imported but used only in import lines) any code line; empty for a file without one."""
    code = [i for i in range(10, len(source.lines)) if _is_code_line(source.lines[i])]
    using = [i for i in code if set(_WORD.findall(source.lines[i])) & set(imported)
             and not source.lines[i].lstrip().startswith(("from ", "import "))]
    return using or code


def _build_repobench(seed: int, index: int, budget: int, count: TokenCounter) -> LongBenchSample:
    pool = _cross_file_candidates()
    for step in range(len(pool)):  # a file without a code line past line 10 (a stdlib's few) gives way to the next
        source, imported = _pick(pool, seed, "repobench-p", index + step)
        cuts = _repobench_cuts(source, imported)
        if cuts:
            break
    else:
        raise ValueError("repobench-p: no standard-library file has a code line past line 10 to complete")
    cut = _rng(seed, "repobench-p", index).choice(cuts)
    used = set(_WORD.findall(source.lines[cut])) & set(imported)
    cross = []
    for module in {imported[name].relpath: imported[name] for name in sorted(used)}.values():
        wanted = {name for name in used if imported[name] is module}
        cross.extend(f"# Path: {module.relpath}\n{snippet}\n" for snippet in _definition_snippets(module, wanted))
    # each definition is cut to its head so that one long class cannot crowd out the rest
    share = max(budget // (2 * max(len(cross), 1)), 16)
    context = "".join(_head_within(piece, share, count) + "\n" for piece in cross)
    header = f"# Path: {source.relpath}\n"
    in_file = _prefix_within(source.lines[:cut], max(budget - count(context) - count(header), 16), count)
    return _sample("repobench-p", seed, index, header + in_file, context, [source.lines[cut].strip()])


# --------------------------------------------------------------------------- registry
_BUILDERS: dict[str, Callable[[int, int, int, TokenCounter], LongBenchSample]] = {
    "qasper": _build_qasper,
    "multifieldqa_en": _build_multifieldqa,
    "hotpotqa": _build_hotpot("bridge", "hotpotqa"),
    "2wikimqa": _build_hotpot("comparison", "2wikimqa"),
    "gov_report": _build_gov_report,
    "multi_news": _build_multi_news,
    "trec": _build_trec,
    "triviaqa": _build_triviaqa,
    "samsum": _build_samsum,
    "passage_count": _build_passage_count,
    "passage_retrieval_en": _build_passage_retrieval,
    "lcc": _build_lcc,
    "repobench-p": _build_repobench,
}
assert tuple(_BUILDERS) == DATASETS and tuple(SUBSTITUTES) == DATASETS


def build_samples(
    dataset: str,
    n_samples: int,
    context_tokens: Sequence[int],
    seed: int,
    count_tokens: TokenCounter = whitespace_tokens,
) -> list[LongBenchSample]:
    """``n_samples`` LongBench-style samples of ``dataset``; sample i targets ``context_tokens[i % len]`` tokens.

    Deterministic in ``seed``; sample i does not depend on ``n_samples``.
    """
    if dataset not in _BUILDERS:
        raise ValueError(f"unknown LongBench-E dataset {dataset!r}; known: {list(DATASETS)}")
    if n_samples < 0:
        raise ValueError(f"n_samples must be non-negative, got {n_samples}")
    if not context_tokens or min(context_tokens) < 64:
        raise ValueError(f"context_tokens must be a non-empty list of budgets >= 64 tokens, got {list(context_tokens)}")
    build = _BUILDERS[dataset]
    return [build(seed, i, int(context_tokens[i % len(context_tokens)]), count_tokens) for i in range(n_samples)]
