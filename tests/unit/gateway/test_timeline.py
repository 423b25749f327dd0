"""The stage timeline: consecutive stamps, gaps skipped, clock skew clamped."""

from libs.contracts import InferenceResult, Timings
from services.gateway.timeline import STAGES, stages


def _result(**stamps) -> InferenceResult:
    return InferenceResult(request_id="r1", worker_id="w1", ok=True, text="hi", timings=Timings(**stamps))


def test_every_stage_between_consecutive_stamps_and_they_add_up():
    result = _result(
        fetched_at=10.010, engine_added_at=10.012, first_token_at=10.5, last_token_at=11.0, result_sent_at=11.001
    )
    spans = stages(
        accepted_at=10.0,
        publish_started_at=10.001,
        published_at=10.002,
        result=result,
        received_at=11.003,
        replied_at=11.004,
    )
    assert list(spans) == list(STAGES)
    assert abs(spans["to_worker"] - 0.008) < 1e-9 and abs(spans["prefill"] - 0.488) < 1e-9
    assert abs(sum(spans.values()) - 1.004) < 1e-9  # accept -> reply, nothing unaccounted


def test_missing_stamps_leave_out_only_their_stages_and_skew_is_clamped():
    result = _result(
        fetched_at=9.9, engine_added_at=None, first_token_at=None, last_token_at=None, result_sent_at=None
    )  # (an old worker, and a clock behind the gateway's)
    spans = stages(
        accepted_at=10.0,
        publish_started_at=10.001,
        published_at=10.002,
        result=result,
        received_at=10.5,
        replied_at=10.6,
    )
    assert spans["to_worker"] == 0.0
    assert set(spans) == {"gateway_in", "publish", "to_worker", "reply"}
