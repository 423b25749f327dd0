"""Every subject a publisher waits on maps to exactly the stream that stores it."""

from __future__ import annotations

import pytest

from libs.contracts import subjects


@pytest.mark.parametrize(
    ("subject", "stream"),
    [
        (subjects.TRAIN_JOBS, subjects.TRAIN_STREAM),
        (subjects.train_progress("job-1"), subjects.TRAIN_PROGRESS_STREAM),
        (subjects.adapter_event("registered"), subjects.EVENTS_STREAM),
        (subjects.EVALUATED, subjects.EVENTS_STREAM),
        (subjects.dead_letter("eval-gate"), subjects.DLQ_STREAM),
        (subjects.infer("p", "w", "a"), subjects.INFER_STREAM),
    ],
)
def test_stream_of(subject, stream):
    assert subjects.stream_of(subject) == stream


def test_unstored_subjects_are_refused():
    with pytest.raises(ValueError, match="no stream"):
        subjects.stream_of(subjects.RESOLVE)
    with pytest.raises(ValueError):
        subjects.stream_of("lpx.train")  # '>' needs at least one more token


def test_per_gateway_result_and_token_subjects_are_stored_and_separate():
    from libs.contracts import subjects

    assert subjects.result_subject("r1", "gw-a") == "lpx.results.gw.gw-a.r1"
    assert subjects.result_subject("r1", None) == subjects.results("r1")
    assert subjects.token_subject("r1", "gw-a") == "lpx.tokens.gw.gw-a.r1"
    assert subjects.stream_of(subjects.results_to("gw-a", "r1")) == subjects.RESULTS_STREAM
    assert subjects._matches(subjects.results_to_filter("gw-a"), subjects.results_to("gw-a", "r1"))
    assert not subjects._matches(subjects.results_to_filter("gw-b"), subjects.results_to("gw-a", "r1"))
    assert subjects.worker_durable("p", "w1") == "w-p-w1"


def test_tenant_scoped_subjects_name_their_tenant_and_nothing_else():
    assert subjects.submitter_of(subjects.submit("acme")) == "acme"
    for other in ("lpx.submit", "lpx.submit.a.b", "lpx.results.acme", "lpx.submit.*"):
        assert subjects.submitter_of(other) is None
    assert subjects.stream_of(subjects.submit("acme")) == subjects.SUBMIT_STREAM
    assert subjects.stream_of(subjects.tenant_results("acme", "r1")) == subjects.RESULTS_STREAM
    assert subjects._matches(subjects.tenant_results_filter("acme"), subjects.tenant_results("acme", "r1"))
    assert not subjects._matches(subjects.tenant_results_filter("acme"), subjects.tenant_results("acme2", "r1"))
    assert not subjects._matches(subjects.tenant_results_filter("acme"), subjects.results_to("gw", "r1"))
