"""One LongBench sample, in the fields of the released jsonl files.

The real files (``THUDM/LongBench``, ``data/<name>_e.jsonl``) have one JSON object per line with
``input``, ``context``, ``answers`` (list), ``length`` (words of input + context + answers for English),
``dataset``, ``language``, ``all_classes`` (list or null) and ``_id``. The embedded LongBench-style
builders produce the same record, so the experiment cannot tell the two apart.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["LongBenchSample", "word_length"]

_REQUIRED = ("input", "context", "answers", "length", "dataset", "_id")


def word_length(input_text: str, context: str, answers: Sequence[str]) -> int:
    """LongBench's ``length`` for English: whitespace words of input + context + answers."""
    return len(input_text.split()) + len(context.split()) + sum(len(answer.split()) for answer in answers)


@dataclass(frozen=True)
class LongBenchSample:
    """A sample of one LongBench(-E) dataset."""

    dataset: str
    sample_id: str
    input: str
    context: str
    answers: tuple[str, ...]
    length: int
    all_classes: tuple[str, ...] = ()
    language: str = "en"

    def __post_init__(self) -> None:
        if not self.answers:
            raise ValueError(f"{self.dataset} sample {self.sample_id!r} has no reference answers")
        if self.length < 0:
            raise ValueError(f"{self.dataset} sample {self.sample_id!r} has negative length {self.length}")

    @classmethod
    def from_record(cls, record: Mapping[str, Any], dataset: str | None = None) -> "LongBenchSample":
        """Parse one jsonl record; ``dataset`` (the file's dataset, without ``_e``) must match the record's."""
        missing = [key for key in _REQUIRED if key not in record]
        if missing:
            raise ValueError(f"LongBench record lacks fields {missing}; has {sorted(record)}")
        name = str(record["dataset"])
        if name.endswith("_e"):
            name = name[:-2]
        if dataset is not None and name != dataset:
            raise ValueError(f"record of dataset {record['dataset']!r} found where {dataset!r} was expected")
        answers = record["answers"]
        if isinstance(answers, str) or not isinstance(answers, Sequence):
            raise ValueError(f"record {record['_id']!r}: answers must be a list, got {type(answers).__name__}")
        return cls(
            dataset=name,
            sample_id=str(record["_id"]),
            input=str(record["input"] or ""),
            context=str(record["context"] or ""),
            answers=tuple(str(a) for a in answers),
            length=int(record["length"]),
            all_classes=tuple(str(c) for c in (record.get("all_classes") or ())),
            language=str(record.get("language") or "en"),
        )

    def to_record(self) -> dict[str, Any]:
        """The jsonl form (inverse of :meth:`from_record`)."""
        return {
            "input": self.input,
            "context": self.context,
            "answers": list(self.answers),
            "length": self.length,
            "dataset": self.dataset,
            "language": self.language,
            "all_classes": list(self.all_classes) or None,
            "_id": self.sample_id,
        }
