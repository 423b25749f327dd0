"""Dispatcher logic with fake NATS: routing through libs.routing, in-flight accounting, the digest
check (a mismatch is an error and a counted alert), first result wins, deadlines, re-routing."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider

from libs.contracts import (
    FRESH_REQUEST_HEADER,
    AdapterRef,
    InferenceRequest,
    InferenceResult,
    WorkerHeartbeat,
    subjects,
)
from services.gateway.dispatch import DigestMismatch, Dispatcher
from services.gateway.errors import GatewayError
from services.gateway.metrics import GatewayMetrics
from services.gateway.pool_view import select_pool
from services.gateway.reroute import Rerouter

REF = AdapterRef(digest="a" * 64, object_key="k", base_model="llama", rank=16)
OTHER = "b" * 64


class FakeJS:
    def __init__(self) -> None:
        self.published: list[tuple[str, bytes, dict]] = []

    async def publish(self, subject, data, headers=None, stream=None, timeout=None):
        self.published.append((subject, data, headers or {}))


class FakePools:
    def __init__(self, workers: list[str]) -> None:
        self.set(workers)
        self._kv = None

    def set(self, workers):
        self.live = {
            w: WorkerHeartbeat(worker_id=w, pool="p", base_model="llama", max_rank=16, capacity=8, in_flight=0)
            for w in workers
        }

    def select(self, base, rank):
        return select_pool(self.live, base, rank)

    def pool_workers(self, pool):
        return tuple(sorted(self.live))


@dataclass
class Msg:
    data: bytes
    subject: str = "lpx.results.x"


def make(workers=("w1", "w2")):
    reader = InMemoryMetricReader()
    metrics = GatewayMetrics.create(MeterProvider(metric_readers=[reader]).get_meter("t"))
    js, pools = FakeJS(), FakePools(list(workers))
    tracer = TracerProvider().get_tracer("t")
    return Dispatcher(None, js, pools, metrics, tracer=tracer), js, pools, reader


def request(rid: str, adapter=REF) -> InferenceRequest:
    return InferenceRequest(
        request_id=rid, tenant_id="acme", base_model="llama", adapter=adapter, prompt="hi", deadline=time.time() + 30
    )


def result(rid: str, digest: str | None, worker: str = "w1", ok: bool = True) -> Msg:
    return Msg(
        InferenceResult(request_id=rid, worker_id=worker, ok=ok, text="ahoy", adapter_digest_applied=digest)
        .model_dump_json()
        .encode()
    )


def counter(reader, name: str) -> float:
    total = 0
    for rm in reader.get_metrics_data().resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name == name:
                    total += sum(p.value for p in metric.data.data_points)
    return total


async def test_routes_with_affinity_and_publishes_with_msg_id():
    d, js, _, _ = make()
    job = await d.submit(request("r1"), rank=16)
    subject, _, headers = js.published[0]
    assert subject == subjects.infer("p", job.worker, REF.digest) and headers["Nats-Msg-Id"] == "r1"
    assert headers["traceparent"].startswith("00-")  # the worker continues the gateway's trace
    job2 = await d.submit(request("r2"), rank=16)
    assert job2.worker == job.worker  # same adapter, light load: the same (primary) worker
    assert d.loads[job.worker] == 2 and d.adapter_loads["p"][REF.digest] == 2


async def test_digest_mismatch_is_an_error_and_counted():
    d, _, _, reader = make()
    job = await d.submit(request("r1"), rank=16)
    await d._on_result(result("r1", OTHER))
    with pytest.raises(DigestMismatch) as info:
        await d.wait(job, time.time() + 5)
    assert info.value.status == 502 and info.value.code == "adapter_digest_mismatch"
    assert counter(reader, "lpx_gateway_digest_mismatch") == 1
    assert not d.jobs and not d.loads


async def test_base_request_answered_with_an_adapter_is_a_mismatch_too():
    d, _, _, _ = make()
    job = await d.submit(request("r1", adapter=None), rank=None)
    assert job.token == "base"
    await d._on_result(result("r1", REF.digest))
    with pytest.raises(DigestMismatch):
        await d.wait(job, time.time() + 5)


async def test_matching_digest_succeeds_and_later_results_are_dropped():
    d, _, _, reader = make()
    job = await d.submit(request("r1"), rank=16)
    await d._on_result(result("r1", REF.digest))
    await d._on_result(result("r1", REF.digest, worker="w2"))
    assert (await d.wait(job, time.time() + 5)).worker_id == "w1"
    assert counter(reader, "lpx_gateway_duplicate_results") == 1


async def test_tokens_are_counted_per_tenant_once_per_request():
    d, _, _, reader = make()
    job = await d.submit(request("r1"), rank=16)
    answer = InferenceResult(
        request_id="r1",
        worker_id="w1",
        ok=True,
        text="ahoy",
        adapter_digest_applied=REF.digest,
        prompt_tokens=5,
        completion_tokens=3,
    )
    for _ in range(2):  # the second (a re-routed request answered twice) is dropped, not counted
        await d._on_result(Msg(answer.model_dump_json().encode()))
    await d.wait(job, time.time() + 5)
    points = {
        tuple(sorted(p.attributes.items())): p.value
        for rm in reader.get_metrics_data().resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == "lpx_gateway_tokens"
        for p in m.data.data_points
    }
    assert points == {(("kind", "prompt"), ("tenant", "acme")): 5, (("kind", "completion"), ("tenant", "acme")): 3}


async def test_worker_errors_and_deadlines():
    d, _, _, _ = make()
    job = await d.submit(request("r1"), rank=16)
    await d._on_result(result("r1", None, ok=False))
    with pytest.raises(GatewayError):
        await d.wait(job, time.time() + 5)
    job = await d.submit(request("r2"), rank=16)
    with pytest.raises(GatewayError) as info:
        await d.wait(job, time.time() + 0.05)
    assert info.value.status == 504 and "r2" not in d.jobs and not d.loads


async def test_no_live_worker_is_503():
    d, _, _, _ = make(workers=())
    with pytest.raises(GatewayError) as info:
        await d.submit(request("r1"), rank=16)
    assert info.value.status == 503


async def test_lost_worker_requests_are_rerouted_to_live_ones():
    d, js, pools, reader = make(workers=("w1", "w2"))
    jobs = [await d.submit(request(f"r{i}"), rank=16) for i in range(4)]
    victim = jobs[0].worker
    survivor = ({"w1", "w2"} - {victim}).pop()
    stranded = [j for j in jobs if j.worker == victim]
    pools.set([survivor])
    rerouter = Rerouter(d)
    assert await rerouter.reroute(victim, reason="lost") == len(stranded)
    moved = js.published[len(jobs) :]
    assert {s for s, _, _ in moved} == {subjects.infer("p", survivor, REF.digest)}
    assert all(h["Nats-Msg-Id"].endswith("-reroute-2") for _, _, h in moved)
    assert d.loads.get(victim, 0) == 0 and d.loads[survivor] == 4
    pools.set([])
    await rerouter.reroute(survivor, reason="lost")  # nobody left: the pool-shared subject
    assert js.published[-1][0] == subjects.infer_any("p", REF.digest)
    await asyncio.sleep(0)
    assert counter(reader, "lpx_gateway_reroutes") == len(stranded) + 4


async def test_only_a_fresh_first_dispatch_is_marked_fresh_and_re_routes_never_are():
    """The worker skips its duplicate lookup on the mark: only the first dispatch of an id the gateway
    minted may carry it (an async submission may have been dispatched by another gateway before)."""
    d, js, pools, _ = make(workers=("w1", "w2"))
    fresh = await d.submit(request("r1"), rank=16, fresh=True)
    await d.submit(request("r2"), rank=16)
    assert js.published[0][2][FRESH_REQUEST_HEADER] == "1"
    assert FRESH_REQUEST_HEADER not in js.published[1][2]
    pools.set([({"w1", "w2"} - {fresh.worker}).pop()])
    assert await Rerouter(d).reroute(fresh.worker, reason="lost") >= 1
    assert all(FRESH_REQUEST_HEADER not in h for _, _, h in js.published[2:])


async def test_streaming_events_end_with_the_checked_result():
    d, _, _, _ = make()
    job = await d.submit(request("r1"), rank=16, stream=True)
    from libs.contracts import TokenDelta

    for i, piece in enumerate(["ah", "o"]):
        await d._on_token(
            Msg(
                TokenDelta(request_id="r1", index=i, text=piece).model_dump_json().encode(),
                subject=subjects.tokens("r1"),
            )
        )
    await d._on_result(result("r1", REF.digest))  # full text "ahoy": the missing "y" comes last
    events = [e async for e in d.events(job, time.time() + 5)]
    assert [e.text for e in events[:-1]] == ["ah", "o", "y"] and isinstance(events[-1], InferenceResult)


async def test_a_missed_delta_ends_the_deltas_and_the_result_brings_the_rest():
    """Token deltas are core NATS: a broker restart can lose one. The deltas after the hole are not
    forwarded (the streamed text would skip a piece and then differ from the final answer, a 502
    stream_diverged); what was not streamed comes with the final result."""
    from libs.contracts import TokenDelta

    d, _, _, reader = make()
    job = await d.submit(request("r1"), rank=16, stream=True)
    for i, piece in ((0, "a"), (2, "o"), (3, "y")):  # delta 1 ("h") was lost
        delta = TokenDelta(request_id="r1", index=i, text=piece).model_dump_json().encode()
        await d._on_token(Msg(delta, subject=subjects.tokens("r1")))
    await d._on_result(result("r1", REF.digest))
    events = [e async for e in d.events(job, time.time() + 5)]
    assert [e.text for e in events[:-1]] == ["a", "hoy"] and isinstance(events[-1], InferenceResult)
    assert counter(reader, "lpx_gateway_token_gaps") == 1


async def test_streamed_logprobs_are_completed_by_the_final_result():
    from libs.contracts import TokenDelta, TokenLogprob

    d, _, _, _ = make()
    job = await d.submit(request("r2"), rank=16, stream=True)
    tokens = [TokenLogprob(token=t, logprob=-0.1 * i) for i, t in enumerate(["ah", "o", "y"])]
    first = TokenDelta(request_id="r2", index=0, text="ah", logprobs=tokens[:1])
    await d._on_token(Msg(first.model_dump_json().encode(), subject=subjects.tokens("r2")))
    final = InferenceResult(
        request_id="r2", worker_id="w1", ok=True, text="ahoy", adapter_digest_applied=REF.digest, logprobs=tokens
    )
    await d._on_result(Msg(final.model_dump_json().encode()))
    events = [e async for e in d.events(job, time.time() + 5)]
    assert [e.text for e in events[:-1]] == ["ah", "oy"]  # the worker's other deltas never came: the rest at once
    assert [t for e in events[:-1] for t in e.logprobs] == tokens  # every token's logprob once, in order


async def test_a_waiting_stream_gets_each_delta_as_it_comes_and_ends_at_its_deadline():
    """The reader waits on an empty queue (services/gateway/dispatch/job.DeltaQueue): woken by a delta, by
    the final result, and by nothing at the deadline (504, and the job is no longer tracked)."""
    from libs.contracts import TokenDelta

    d, _, _, _ = make()
    job = await d.submit(request("r1"), rank=16, stream=True)
    seen: list[str] = []

    async def read() -> list:
        events = []
        async for event in d.events(job, time.time() + 5):
            events.append(event)
            seen.append(getattr(event, "text", ""))
        return events

    reader = asyncio.create_task(read())
    for i, piece in enumerate(["ah", "o"]):
        await asyncio.sleep(0.02)  # the reader is waiting on an empty queue
        delta = TokenDelta(request_id="r1", index=i, text=piece).model_dump_json().encode()
        await d._on_token(Msg(delta, subject=subjects.tokens("r1")))
        await asyncio.sleep(0.01)
        assert seen[-1] == piece, "a delta did not wake the waiting reader"
    await asyncio.sleep(0.02)
    await d._on_result(result("r1", REF.digest))
    events = await asyncio.wait_for(reader, 2)
    assert [e.text for e in events[:-1]] == ["ah", "o", "y"] and isinstance(events[-1], InferenceResult)

    quiet = await d.submit(request("r2"), rank=16, stream=True)
    started = time.monotonic()
    with pytest.raises(GatewayError) as info:
        async for _ in d.events(quiet, time.time() + 0.2):
            pass
    assert info.value.status == 504 and 0.15 < time.monotonic() - started < 2.0
    assert "r2" not in d.jobs


def test_baseline_policies_route_by_the_same_loads():
    d, _js, _pools, _reader = make(("w1", "w2", "w3"))
    d.routing_policy = "least_loaded"
    d.loads.update({"w1": 3, "w2": 0, "w3": 5})
    assert d.route("p", ("w1", "w2", "w3"), "a" * 64).worker == "w2"
    d.routing_policy = "random"
    chosen = {d.route("p", ("w1", "w2", "w3"), f"adapter-{i}").worker for i in range(50)}
    assert chosen == {"w1", "w2", "w3"}


async def test_an_interactive_request_leaves_a_full_affinity_worker_for_one_with_a_free_sequence():
    d, js, pools, _ = make()
    primary = d.route("p", ("w1", "w2"), REF.digest).worker
    other = "w2" if primary == "w1" else "w1"
    now = time.time()
    pools.live[primary] = pools.live[primary].model_copy(update={"in_flight": 8, "ts": now})  # all 8 busy
    pools.live[other] = pools.live[other].model_copy(update={"in_flight": 7, "ts": now})  # one free
    assert d.route("p", ("w1", "w2"), REF.digest).worker == primary  # within the bounded load: affinity
    chat = await d.submit(request("c1"), rank=16, interactive=True)
    assert chat.worker == other and chat.decision.spilled and not chat.decision.affinity_hit
    d.abandon(chat)
    batch = await d.submit(request("b1"), rank=16, interactive=False)
    assert batch.worker == primary  # batch work keeps its affinity (it never queues past the capacity anyway)
