"""LongBench-E's per-dataset prompt templates, generation lengths and prompt handling.

Written from the public spec of THUDM/LongBench (``config/dataset2prompt.json``,
``config/dataset2maxlen.json`` and ``pred.py``): a template is filled with a sample's ``context`` and
``input``; a prompt longer than the model's budget keeps its first and last ``max_length // 2`` tokens
(the middle goes: the instructions sit at both ends); chat models get their chat template except on
the few-shot and code datasets, which are continuation tasks; decoding is greedy with the dataset's
maximum number of new tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DATASETS",
    "PROMPT_TEMPLATES",
    "MAX_NEW_TOKENS",
    "NO_CHAT_TEMPLATE_DATASETS",
    "DatasetSpec",
    "dataset_spec",
    "format_prompt",
    "truncate_middle",
]

#: The 13 English LongBench-E datasets, in the paper's column order (Table 1).
DATASETS: tuple[str, ...] = (
    "qasper",
    "multifieldqa_en",
    "hotpotqa",
    "2wikimqa",
    "gov_report",
    "multi_news",
    "trec",
    "triviaqa",
    "samsum",
    "passage_count",
    "passage_retrieval_en",
    "lcc",
    "repobench-p",
)

_QA_PASSAGES = (
    "Answer the question based on the given passages. Only give me the answer and do not output any other words."
    "\n\nThe following are given passages.\n{context}\n\n"
    "Answer the question based on the given passages. Only give me the answer and do not output any other words."
    "\n\nQuestion: {input}\nAnswer:"
)
_QASPER_RULES = (
    "Answer the question as concisely as you can, using a single phrase or sentence if possible. "
    'If the question cannot be answered based on the information in the article, write "unanswerable". '
    'If the question is a yes/no question, answer "yes", "no", or "unanswerable". Do not provide any explanation.'
)

#: LongBench's dataset2prompt (English LongBench-E subsets), placeholders ``{context}`` and ``{input}``.
PROMPT_TEMPLATES: dict[str, str] = {
    "qasper": (
        "You are given a scientific article and a question. " + _QASPER_RULES + "\n\nArticle: {context}\n\n "
        + _QASPER_RULES.replace("Answer the question as", "Answer the question based on the above article as", 1)
        + "\n\nQuestion: {input}\n\nAnswer:"
    ),
    "multifieldqa_en": (
        "Read the following text and answer briefly.\n\n{context}\n\n"
        "Now, answer the following question based on the above text, only give me the answer and do not output "
        "any other words.\n\nQuestion: {input}\nAnswer:"
    ),
    "hotpotqa": _QA_PASSAGES,
    "2wikimqa": _QA_PASSAGES,
    "gov_report": (
        "You are given a report by a government agency. Write a one-page summary of the report.\n\n"
        "Report:\n{context}\n\nNow, write a one-page summary of the report.\n\nSummary:"
    ),
    "multi_news": (
        "You are given several news passages. Write a one-page summary of all news. \n\n"
        "News:\n{context}\n\nNow, write a one-page summary of all the news.\n\nSummary:"
    ),
    "trec": (
        "Please determine the type of the question below. Here are some examples of questions.\n\n{context}\n{input}"
    ),
    "triviaqa": (
        "Answer the question based on the given passage. Only give me the answer and do not output any other words. "
        "The following are some examples.\n\n{context}\n\n{input}"
    ),
    "samsum": "Summarize the dialogue into a few short sentences. The following are some examples.\n\n{context}\n\n{input}",
    "passage_count": (
        "There are some paragraphs below sourced from Wikipedia. Some of them may be duplicates. Please carefully "
        "read these paragraphs and determine how many unique paragraphs there are after removing duplicates. "
        "In other words, how many non-repeating paragraphs are there in total?\n\n{context}\n\n"
        "Please enter the final count of unique paragraphs after removing duplicates. The output format should "
        "only contain the number, such as 1, 2, 3, and so on.\n\nThe final answer is: "
    ),
    "passage_retrieval_en": (
        "Here are 30 paragraphs from Wikipedia, along with an abstract. Please determine which paragraph the "
        "abstract is from.\n\n{context}\n\nThe following is an abstract.\n\n{input}\n\n"
        'Please enter the number of the paragraph that the abstract is from. The answer format must be like '
        '"Paragraph 1", "Paragraph 2", etc.\n\nThe answer is: '
    ),
    "lcc": "Please complete the code given below. \n{context}Next line of code:\n",
    "repobench-p": "Please complete the code given below. \n{context}{input}Next line of code:\n",
}

#: LongBench's dataset2maxlen: maximum new tokens per dataset.
MAX_NEW_TOKENS: dict[str, int] = {
    "qasper": 128,
    "multifieldqa_en": 64,
    "hotpotqa": 32,
    "2wikimqa": 32,
    "gov_report": 512,
    "multi_news": 512,
    "trec": 64,
    "triviaqa": 32,
    "samsum": 128,
    "passage_count": 32,
    "passage_retrieval_en": 32,
    "lcc": 64,
    "repobench-p": 64,
}

#: pred.py: "chat models are better off without build prompts on these tasks" (lsht is Chinese).
NO_CHAT_TEMPLATE_DATASETS: frozenset[str] = frozenset({"trec", "triviaqa", "samsum", "lcc", "repobench-p"})


@dataclass(frozen=True)
class DatasetSpec:
    """How LongBench prompts and decodes one dataset."""

    name: str
    template: str
    max_new_tokens: int
    use_chat_template: bool
    stop_at_newline: bool  # samsum: pred.py adds the newline token to the end-of-sequence ids


def dataset_spec(name: str) -> DatasetSpec:
    """The spec of one of the 13 LongBench-E datasets (ValueError for any other name)."""
    if name not in PROMPT_TEMPLATES:
        raise ValueError(f"unknown LongBench-E dataset {name!r}; known: {list(DATASETS)}")
    return DatasetSpec(
        name=name,
        template=PROMPT_TEMPLATES[name],
        max_new_tokens=MAX_NEW_TOKENS[name],
        use_chat_template=name not in NO_CHAT_TEMPLATE_DATASETS,
        stop_at_newline=name == "samsum",
    )


def format_prompt(name: str, sample: Mapping[str, Any]) -> str:
    """Fill the dataset's template with the sample's ``context`` and ``input``.

    Plain substitution of the two placeholders (``str.format`` would choke on braces in code contexts;
    LongBench calls ``format(**json_obj)``, which substitutes the same two fields).
    """
    template = dataset_spec(name).template
    missing = [key for key in ("context", "input") if key not in sample]
    if missing:
        raise ValueError(f"sample for {name!r} lacks {missing}")
    return template.replace("{context}", str(sample["context"])).replace("{input}", str(sample["input"]))


def truncate_middle(token_ids: Sequence[int], max_length: int) -> list[int]:
    """LongBench's truncation: a prompt of more than ``max_length`` tokens keeps its first and last
    ``half = int(max_length / 2)`` tokens and drops the middle.

    The experiment then decodes the two halves back to text and joins them, as LongBench does, because
    the chat template is applied to text (:func:`experiments.longbench.experiment.build_input_ids`).
    """
    if max_length < 2:
        raise ValueError(f"max_length must be at least 2 tokens, got {max_length}")
    ids = list(token_ids)
    if len(ids) <= max_length:
        return ids
    half = int(max_length / 2)
    return ids[:half] + ids[-half:]
