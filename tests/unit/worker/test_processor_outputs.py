"""What a worker sends back besides text: token logprobs (streamed and in the result), a refusal for a
constraint its engine cannot honour, and an error instead of a result too big for one broker message."""

from __future__ import annotations

import json
import time

import pytest

from libs.contracts import InferenceRequest, InferenceResult, SamplingParams, TokenLogprob, TopLogprob
from libs.engine import EngineConfig, GenerationRequest, RequestRejected
from libs.engine.sim_engine import SimEngine, SimProfile
from services.worker.processor import RequestProcessor


class _Recorder:
    def __init__(self, max_payload: int = 1024 * 1024) -> None:
        self.max_payload = max_payload
        self.sent: list[tuple[str, bytes]] = []

    async def publish(self, subject: str, data: bytes, **_) -> None:
        self.sent.append((subject, data))


def _processor(nc: _Recorder, engine=None) -> RequestProcessor:
    return RequestProcessor(worker_id="w1", nc=nc, js=nc, engine=engine, tiers=None, metrics=None, ack_wait_s=30)


async def _sim() -> SimEngine:
    engine = SimEngine(EngineConfig(model_path="/nonexistent", engine="sim"), SimProfile(decode_tok_s=10_000))
    await engine.start()
    return engine


async def test_logprobs_come_with_every_streamed_delta_and_in_the_outcome():
    nc = _Recorder()
    processor = _processor(nc, await _sim())
    request = InferenceRequest(
        request_id="r1",
        tenant_id="t",
        base_model="b",
        prompt="hi",
        stream=True,
        sampling=SamplingParams(max_tokens=4, logprobs=2),
    )
    outcome = await processor._generate(request, None)
    assert len(outcome.logprobs) == outcome.completion_tokens == 4
    assert "".join(t.token for t in outcome.logprobs) == outcome.text
    deltas = [json.loads(data) for _, data in nc.sent]
    assert [len(d["logprobs"]) for d in deltas] == [1, 1, 1, 1]
    assert [d["logprobs"][0]["token"] for d in deltas] == [t.token for t in outcome.logprobs]


async def test_no_logprobs_unless_asked():
    processor = _processor(_Recorder(), await _sim())
    request = InferenceRequest(
        request_id="r2", tenant_id="t", base_model="b", prompt="hi", sampling=SamplingParams(max_tokens=3)
    )
    assert (await processor._generate(request, None)).logprobs is None


async def test_the_simulated_engine_refuses_to_pretend_it_constrains_json():
    engine = await _sim()
    with pytest.raises(RequestRejected, match="structured outputs need the vLLM engine"):
        request = GenerationRequest(request_id="r3", prompt="x", structured={"json_object": True})
        async for _ in engine.generate(request):
            pass


async def test_a_result_over_the_message_limit_becomes_an_error_naming_why():
    nc = _Recorder(max_payload=16 * 1024)
    token = TokenLogprob(token="abc", logprob=-0.5, top=[TopLogprob(token=f"t{i}", logprob=-1.0) for i in range(20)])
    big = InferenceResult(
        request_id="r4", worker_id="w1", ok=True, text="abc" * 100, logprobs=[token] * 100, tenant="t"
    )
    await _processor(nc).results.publish(big, None)
    ((subject, data),) = nc.sent
    sent = InferenceResult.model_validate_json(data)
    assert not sent.ok and sent.error.code == "result_too_large" and "fewer logprob alternatives" in sent.error.message
    assert sent.tenant == "t" and subject.endswith("r4")

    small = InferenceResult(request_id="r5", worker_id="w1", ok=True, text="ok", logprobs=[token])
    await _processor(nc).results.publish(small, None)
    assert InferenceResult.model_validate_json(nc.sent[-1][1]).ok


async def test_the_pool_hears_the_request_leave_before_the_stamp_and_the_worker_stops_counting_after_it():
    """The pool is told the request leaves (`on_leaving`, its report's time in `load_left_at`) before its
    result is stamped; the worker's own count drops (`on_stamped`) after the stamp, before the publish.
    No other worker then counts it past the stamp, and the gateways stop counting it as of that report."""
    nc = _Recorder()
    seen: list[tuple[str, float, int]] = []

    async def leaving() -> float:
        seen.append(("leaving", time.time(), len(nc.sent)))
        return seen[-1][1]

    async def released() -> None:
        seen.append(("stamped", time.time(), len(nc.sent)))

    result = InferenceResult(request_id="r5", worker_id="w1", ok=True, text="x", tenant="t")
    await _processor(nc).results.publish(result, None, on_stamped=released, on_leaving=leaving)
    ((_, data),) = nc.sent
    ((first, left_at, before_leaving), (then, released_at, before_stamped)) = seen
    assert (first, then) == ("leaving", "stamped")
    assert before_leaving == before_stamped == 0
    timings = InferenceResult.model_validate_json(data).timings
    assert timings.load_left_at == left_at <= timings.result_sent_at <= released_at


class _Msg:
    def __init__(self, data: bytes) -> None:
        self.data, self.headers, self.subject, self.acked = data, {}, "lpx.infer.p.w1.t", False

    async def ack(self) -> None:
        self.acked = True


class _Counter:
    def add(self, *_args, **_kwargs) -> None:
        pass


async def test_fetched_at_is_when_the_worker_kept_the_message_not_when_its_task_started():
    nc = _Recorder()
    processor = RequestProcessor(worker_id="w1", nc=nc, js=nc, engine=None, tiers=None, metrics=None, ack_wait_s=30)
    processor.metrics = type("M", (), {"requests": _Counter()})()

    async def never_answered(_request) -> bool:
        return False

    processor._already_answered = never_answered
    # A passed deadline: answered with an error at once, its timings stamped all the same.
    request = InferenceRequest(
        request_id="r5", tenant_id="t", base_model="b", prompt="hi", deadline=time.time() - 1, submitted_at=100.0
    )
    msg = _Msg(request.model_dump_json().encode())
    await processor.handle(msg, taken_at=123.5)
    ((_, data),) = nc.sent
    result = InferenceResult.model_validate_json(data)
    assert msg.acked and result.error.code == "deadline"
    assert result.timings.fetched_at == 123.5 and result.timings.queue_s == pytest.approx(23.5)
