"""Haystack + needle prompts of an exact token length (protocol steps 1-2): the task, sentence starts, builder."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from experiments.needle.scoring import answer_words

_CLOSERS = "\"')]"


def sentence_starts(pieces: list[str]) -> list[int]:
    """Token positions where a sentence may start, given each token's text: 0, every position after a token
    that ends a sentence ([.!?] then closing quotes/brackets) when whitespace follows, and the end."""
    starts = [0]
    for i in range(1, len(pieces)):
        before = pieces[i - 1].rstrip()
        ends_sentence = before.rstrip(_CLOSERS)[-1:] in (".", "!", "?")
        spaced = pieces[i - 1][-1:].isspace() or pieces[i][:1].isspace()
        if ends_sentence and spaced:
            starts.append(i)
    if starts[-1] != len(pieces):
        starts.append(len(pieces))
    return starts


@dataclass(frozen=True)
class NeedleTask:
    """The needle, its question, and the chat prompt around the haystack."""

    needle: str
    question: str
    system: str
    user_template: str  # with {context} and {question}
    answer_prefix: str = ""

    def __post_init__(self) -> None:
        for field_name in ("{context}", "{question}"):
            if field_name not in self.user_template:
                raise ValueError(f"task.user_template must contain {field_name}")

    @property
    def keywords(self) -> tuple[str, ...]:
        return answer_words(self.needle, self.question)


@dataclass(frozen=True)
class NeedlePrompt:
    """One cell's prompt: token ids and where the needle landed."""

    input_ids: torch.Tensor  # (1, context_length)
    context_length: int
    depth: float  # requested, in [0, 1]
    actual_depth: float  # haystack tokens before the needle / haystack tokens
    haystack_tokens: int
    haystack_repeats: bool  # the context is longer than the haystack: its tokens were repeated

    @property
    def prompt_tokens(self) -> int:
        return int(self.input_ids.shape[-1])


class PromptBuilder:
    """Builds needle prompts of exactly ``context_length`` tokens from one tokenized haystack."""

    _SLOT = "\uE000HAYSTACK\uE000"  # a private-use marker where the haystack goes in the chat template

    def __init__(self, tokenizer: Any, haystack: str, task: NeedleTask) -> None:
        self.tokenizer = tokenizer
        self.task = task
        self.haystack_ids = self._encode(haystack)
        if not self.haystack_ids:
            raise ValueError("the haystack is empty")
        chat = self._chat_text(self._SLOT)
        if chat.count(self._SLOT) != 1:
            raise ValueError("the chat template must contain the user's context exactly once")
        prefix, suffix = chat.split(self._SLOT)
        self.prefix_ids, self.suffix_ids = self._encode(prefix), self._encode(suffix)
        self.needle_ids = self._encode(" " + task.needle)
        self.overhead = len(self.prefix_ids) + len(self.suffix_ids)
        self._starts: dict[int, list[int]] = {}

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _chat_text(self, context: str) -> str:
        messages = []
        if self.task.system:
            messages.append({"role": "system", "content": self.task.system})
        user = self.task.user_template.format(context=context, question=self.task.question)
        messages.append({"role": "user", "content": user})
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return text + self.task.answer_prefix

    def _haystack(self, n_tokens: int) -> tuple[list[int], list[int]]:
        """The first ``n_tokens`` haystack tokens (the essays repeated as needed) and their sentence starts."""
        repeats = math.ceil(n_tokens / len(self.haystack_ids))
        ids = (self.haystack_ids * repeats)[:n_tokens]
        if n_tokens not in self._starts:
            pieces = self.tokenizer.batch_decode([[token] for token in ids])
            self._starts[n_tokens] = sentence_starts(pieces)
        return ids, self._starts[n_tokens]

    def build(self, context_length: int, depth: float) -> NeedlePrompt:
        """The prompt of exactly ``context_length`` tokens with the needle at ``depth`` (0..1)."""
        if not 0.0 <= depth <= 1.0:
            raise ValueError(f"depth must be in [0, 1], got {depth}")
        budget = context_length - self.overhead - len(self.needle_ids)
        if budget < 16:
            raise ValueError(
                f"context {context_length} tokens leaves no room for a haystack: the prompt without it takes "
                f"{self.overhead} tokens and the needle {len(self.needle_ids)}"
            )
        haystack, starts = self._haystack(budget)
        position = max(start for start in starts if start <= round(depth * budget))
        ids = self.prefix_ids + haystack[:position] + self.needle_ids + haystack[position:] + self.suffix_ids
        return NeedlePrompt(
            input_ids=torch.tensor([ids], dtype=torch.long),
            context_length=context_length,
            depth=depth,
            actual_depth=position / budget,
            haystack_tokens=budget,
            haystack_repeats=budget > len(self.haystack_ids),
        )
