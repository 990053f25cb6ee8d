"""The needle score: ROUGE-1 recall of the needle's answer words in the answer (protocol step 4)."""

from __future__ import annotations

import re



# Function words dropped when choosing the needle's answer words (the question's words are dropped too).
_STOP_WORDS = frozenset(
    "a an and the to in on of at is are was be for with by it its this that as or from do does what which".split()
)
_WORD = re.compile(r"[a-z0-9]+")



def stem(word: str) -> str:
    """Strip one inflectional suffix (-ing, -ed, -es, -s; not the s of -ss) and a doubled final consonant.

    sitting -> sit, eats -> eat, sandwiches -> sandwich, miss -> miss.
    """
    for suffix in ("ing", "ed", "es", "s"):
        if suffix == "s" and word.endswith("ss"):  # miss, glass: not a plural
            break
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            word = word[: -len(suffix)]
            if suffix in ("ing", "ed") and word[-1] == word[-2] and word[-1] not in "lsz":
                word = word[:-1]
            break
    return word


def _words(text: str) -> list[str]:
    return [stem(word) for word in _WORD.findall(text.lower().replace("'s", ""))]


def answer_words(needle: str, question: str) -> tuple[str, ...]:
    """The needle's content words absent from the question, in order, without repeats."""
    asked = set(_words(question))
    seen: dict[str, None] = {}
    for word in _words(needle):
        if word not in _STOP_WORDS and word not in asked:
            seen.setdefault(word)
    if not seen:
        raise ValueError(f"the needle {needle!r} has no content words beyond the question {question!r}")
    return tuple(seen)


def needle_score(answer: str, keywords: tuple[str, ...]) -> float:
    """ROUGE-1 recall of ``keywords`` in ``answer``: |keywords found| / |keywords| (0 for an empty answer)."""
    if not keywords:
        raise ValueError("needle_score needs at least one keyword")
    found = set(_words(answer))
    return sum(word in found for word in keywords) / len(keywords)
