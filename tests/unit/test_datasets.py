"""Dataset lines: train examples and eval cases are validated line by line, every bad line reported."""

from __future__ import annotations

import json

import pytest

from libs.datasets import Criterion, DatasetInvalid, parse_bytes, parse_lines

USER = {"role": "user", "content": "Where is my order?"}
ANSWER = {"role": "assistant", "content": "Ahoy!"}


def lines(*docs) -> list[str]:
    return [d if isinstance(d, str) else json.dumps(d) for d in docs]


def test_train_and_eval_lines_are_split():
    parsed = parse_lines(
        lines(
            {"messages": [USER, ANSWER]},
            {"split": "eval", "criterion": "contains", "expected": "Ahoy", "messages": [USER]},
            "",
            {"split": "eval", "criterion": "loglik", "messages": [USER, ANSWER], "min_score": -2},
        )
    )
    assert len(parsed.train) == 1 and len(parsed.eval) == 2 and parsed.lines == 3
    assert parsed.train_chats() == [{"messages": [USER, ANSWER]}]
    loglik = parsed.eval[1]
    assert loglik.criterion == Criterion.LOGLIK and loglik.prompt() == [USER] and loglik.reference() == "Ahoy!"
    assert loglik.threshold() == -2 and parsed.eval[0].prompt() == [USER] and parsed.eval[0].reference() is None


def test_every_bad_line_is_reported_with_its_number():
    with pytest.raises(DatasetInvalid) as caught:
        parse_lines(
            lines(
                {"messages": [USER, ANSWER]},
                "{not json",
                {"messages": [USER]},  # no answer to learn
                {"split": "eval", "criterion": "regex", "expected": "([", "messages": [USER]},
                {"split": "test", "messages": [USER, ANSWER]},
                {"split": "eval", "criterion": "contains", "messages": [USER]},  # no expected
                {"messages": [{"role": "robot", "content": "x"}, ANSWER]},
                {"split": "eval", "criterion": "loglik", "messages": [USER]},  # no reference answer
            )
        )
    exc = caught.value
    assert exc.line_numbers == [2, 3, 4, 5, 6, 7, 8]
    text = str(exc)
    assert "line 2: not JSON" in text and "must end with an assistant message" in text
    assert "not a valid regular expression" in text and "split must be 'train' or 'eval'" in text
    assert "needs a non-empty 'expected'" in text and "reference assistant answer" in text


def test_empty_or_non_utf8_datasets_are_refused():
    with pytest.raises(DatasetInvalid, match="no examples"):
        parse_lines(["", "  "])
    with pytest.raises(DatasetInvalid, match="not UTF-8"):
        parse_bytes(b"\xff\xfe{}")
    with pytest.raises(DatasetInvalid, match="no eval cases"):
        parse_lines(lines({"messages": [USER, ANSWER]}), require_eval=True)


def test_reported_errors_are_capped_but_counted():
    with pytest.raises(DatasetInvalid) as caught:
        parse_lines(["{bad"] * 50)
    assert caught.value.total_bad == 50 and len(caught.value.errors) == 20 and "30 more bad lines" in str(caught.value)
