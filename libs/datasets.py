"""Tenant datasets: one chat-format JSONL file holding a train split and an eval split.

The registry validates a dataset with this module before storing it (every bad line is reported by
number; nothing is stored), the trainer reads the train split, the eval gate reads the eval split.

A line is one JSON object:

    {"messages": [{"role": "user", "content": "Where is my order?"},
                  {"role": "assistant", "content": "Ahoy matey! ..."}]}                      # train (default)
    {"split": "eval", "criterion": "contains", "expected": "Ahoy",
     "messages": [{"role": "user", "content": "Can I pay by card?"}]}                        # eval, text check
    {"split": "eval", "criterion": "loglik", "min_score": -1.0,
     "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Ahoy!"}]}  # eval, score

Criteria (the eval gate applies them to the serving engine's greedy output):
- exact: the answer, stripped, equals `expected` (stripped);
- contains: the answer contains `expected`;
- regex: `expected` (a Python regular expression) matches somewhere in the answer;
- loglik: the mean token log-likelihood of the reference answer (the last assistant message) is at
  least `min_score` (nats per token; default -1.0, i.e. ~37% mean per-token probability).
`ignore_case` applies to exact, contains and regex.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from libs.contracts import ChatMessage

DEFAULT_MIN_LOGLIK = -1.0
MAX_REPORTED_ERRORS = 20


class Criterion(StrEnum):
    EXACT = "exact"
    CONTAINS = "contains"
    REGEX = "regex"
    LOGLIK = "loglik"


TEXT_CRITERIA = frozenset({Criterion.EXACT, Criterion.CONTAINS, Criterion.REGEX})


class TrainExample(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    split: Literal["train"] = "train"
    messages: list[ChatMessage] = Field(min_length=1)

    @model_validator(mode="after")
    def _ends_with_answer(self) -> TrainExample:
        if self.messages[-1].role != "assistant":
            raise ValueError("a train example must end with an assistant message (the answer to learn)")
        if not any(m.role == "user" for m in self.messages[:-1]):
            raise ValueError("a train example needs a user message before the answer")
        return self

    def chat(self) -> list[dict]:
        return [m.model_dump() for m in self.messages]


class EvalCase(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    split: Literal["eval"]
    id: str | None = Field(default=None, max_length=100)
    messages: list[ChatMessage] = Field(min_length=1)
    criterion: Criterion
    expected: str | None = None
    min_score: float | None = None
    ignore_case: bool = False

    @model_validator(mode="after")
    def _consistent(self) -> EvalCase:
        if self.criterion in TEXT_CRITERIA:
            if self.expected is None or self.expected == "":
                raise ValueError(f"criterion {self.criterion!s} needs a non-empty 'expected'")
            if self.messages[-1].role != "user":
                raise ValueError(f"criterion {self.criterion!s} needs messages ending with the user's question")
            if self.criterion == Criterion.REGEX:
                try:
                    re.compile(self.expected)
                except re.error as exc:
                    raise ValueError(f"'expected' is not a valid regular expression: {exc}") from None
        else:
            if self.messages[-1].role != "assistant" or len(self.messages) < 2:
                raise ValueError("criterion loglik needs messages ending with the reference assistant answer")
            if self.expected is not None:
                raise ValueError("criterion loglik scores the last assistant message; drop 'expected'")
        return self

    def prompt(self) -> list[dict]:
        """The conversation the engine answers (without the reference answer for loglik)."""
        turns = self.messages[:-1] if self.criterion == Criterion.LOGLIK else self.messages
        return [m.model_dump() for m in turns]

    def reference(self) -> str | None:
        return self.messages[-1].content if self.criterion == Criterion.LOGLIK else None

    def threshold(self) -> float:
        return DEFAULT_MIN_LOGLIK if self.min_score is None else self.min_score


@dataclass
class ParsedDataset:
    train: list[TrainExample] = field(default_factory=list)
    eval: list[EvalCase] = field(default_factory=list)

    @property
    def lines(self) -> int:
        return len(self.train) + len(self.eval)

    def train_chats(self) -> list[dict]:
        """Examples in the trainer's shape: {"messages": [...]}."""
        return [{"messages": ex.chat()} for ex in self.train]


class DatasetInvalid(ValueError):
    """The dataset is refused; `errors` lists (line number, what is wrong) for every bad line seen."""

    def __init__(self, errors: list[tuple[int, str]], total_bad: int | None = None) -> None:
        self.errors = errors
        self.total_bad = total_bad if total_bad is not None else len(errors)
        shown = "; ".join(f"line {n}: {msg}" if n else msg for n, msg in errors)
        more = f" (and {self.total_bad - len(errors)} more bad lines)" if self.total_bad > len(errors) else ""
        lines = [n for n, _ in errors if n]
        super().__init__(f"{self.total_bad} bad line(s): {shown}{more}" if lines else shown)

    @property
    def line_numbers(self) -> list[int]:
        return [n for n, _ in self.errors if n]


def _explain(exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first.get("loc", ()))
    message = first.get("msg", "invalid").removeprefix("Value error, ")
    return f"{where}: {message}" if where else message


def parse_line(text: str) -> TrainExample | EvalCase:
    """One line, or ValueError with a message a person can act on."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(doc, dict):
        raise ValueError("a line must be a JSON object with 'messages'")
    split = doc.get("split", "train")
    model = {"train": TrainExample, "eval": EvalCase}.get(split) if isinstance(split, str) else None
    if model is None:
        raise ValueError(f"split must be 'train' or 'eval', not {split!r}")
    try:
        return model.model_validate(doc)
    except ValidationError as exc:
        raise ValueError(_explain(exc)) from None


def parse_lines(lines, *, require_train: bool = False, require_eval: bool = False) -> ParsedDataset:
    """Every line is checked; all bad lines are reported together (the first MAX_REPORTED_ERRORS)."""
    parsed, errors, bad = ParsedDataset(), [], 0
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            item = parse_line(text)
        except ValueError as exc:
            bad += 1
            if len(errors) < MAX_REPORTED_ERRORS:
                errors.append((number, str(exc)))
            continue
        (parsed.train if isinstance(item, TrainExample) else parsed.eval).append(item)
    if bad:
        raise DatasetInvalid(errors, bad)
    if not parsed.lines:
        raise DatasetInvalid([(0, "the dataset has no examples")])
    if require_train and not parsed.train:
        raise DatasetInvalid([(0, "the dataset has no train examples")])
    if require_eval and not parsed.eval:
        raise DatasetInvalid([(0, 'the dataset has no eval cases (lines with "split": "eval")')])
    return parsed


def parse_file(path: Path, **kwargs) -> ParsedDataset:
    try:
        with open(path, encoding="utf-8") as handle:
            return parse_lines(handle, **kwargs)
    except UnicodeDecodeError as exc:
        raise DatasetInvalid([(0, f"the file is not UTF-8 text ({exc.reason} at byte {exc.start})")]) from None


def parse_bytes(data: bytes, **kwargs) -> ParsedDataset:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DatasetInvalid([(0, f"the file is not UTF-8 text ({exc.reason} at byte {exc.start})")]) from None
    return parse_lines(text.splitlines(), **kwargs)
