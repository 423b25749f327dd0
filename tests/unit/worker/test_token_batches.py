"""Streamed tokens leave the worker as one message per engine step and gateway: the deltas of every
request woken by a step go out together, each request's in order, split under the broker's limit; requests
without a gateway, and a worker with batches off, keep one message per delta. The gateway reads both."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

from opentelemetry import metrics

from libs.contracts import InferenceRequest, SamplingParams, TokenBatch, TokenDelta, subjects
from libs.engine import EngineConfig
from libs.engine.sim_engine import SimEngine, SimProfile
from services.gateway.dispatch.delivery import Delivery
from services.gateway.metrics import GatewayMetrics
from services.worker.processor import RequestProcessor
from services.worker.token_batches import TokenBatches, _split


class _Recorder:
    def __init__(self, max_payload: int = 1024 * 1024, fail: bool = False) -> None:
        self.max_payload = max_payload
        self.fail = fail
        self.sent: list[tuple[str, bytes]] = []

    async def publish(self, subject: str, data: bytes, **_) -> None:
        if self.fail:
            raise ConnectionError("broker away")
        self.sent.append((subject, data))


def _delta(rid: str, index: int, text: str = "x") -> TokenDelta:
    return TokenDelta(request_id=rid, index=index, text=text)


async def test_deltas_of_one_loop_pass_go_out_as_one_message_per_gateway():
    nc = _Recorder()
    batches = TokenBatches(nc, "w1")
    await batches.send(_delta("r1", 0), "gw-a")
    await batches.send(_delta("r2", 0), "gw-a")
    await batches.send(_delta("r3", 0), "gw-b")
    await batches.send(_delta("r1", 1), "gw-a")
    assert nc.sent == []  # nothing before the pass ends
    await batches.drain()
    assert [subject for subject, _ in nc.sent] == [
        subjects.token_batch_to("gw-a", "w1"),
        subjects.token_batch_to("gw-b", "w1"),
    ]
    first = TokenBatch.model_validate_json(nc.sent[0][1])
    assert first.worker_id == "w1"
    assert [(d.request_id, d.index) for d in first.deltas] == [("r1", 0), ("r2", 0), ("r1", 1)]
    assert batches.messages == 2 and batches.deltas == 4


async def test_without_a_gateway_or_with_batches_off_every_delta_is_its_own_message():
    nc = _Recorder()
    await TokenBatches(nc, "w1").send(_delta("r1", 0), None)
    await TokenBatches(nc, "w1", enabled=False).send(_delta("r2", 0), "gw-a")
    assert [subject for subject, _ in nc.sent] == [subjects.tokens("r1"), subjects.tokens_to("gw-a", "r2")]
    assert TokenDelta.model_validate_json(nc.sent[1][1]).request_id == "r2"


async def test_a_step_over_the_message_limit_is_split_in_order():
    nc = _Recorder(max_payload=4096 + 256 + 300)  # room for a few deltas per message
    batches = TokenBatches(nc, "w1")
    for i in range(20):
        await batches.send(_delta("r1", i, "y" * 20), "gw-a")
    await batches.drain()
    assert len(nc.sent) > 1
    indexes = [d.index for _, data in nc.sent for d in TokenBatch.model_validate_json(data).deltas]
    assert indexes == list(range(20))
    assert all(len(data) <= 4096 + 256 + 300 for _, data in nc.sent)


def test_split_keeps_runs_within_the_budget_and_an_oversized_part_alone():
    assert _split([b"aa", b"bb", b"cc"], 6) == [[b"aa", b"bb"], [b"cc"]]
    assert _split([b"a" * 10, b"b"], 4) == [[b"a" * 10], [b"b"]]


async def test_a_refused_batch_is_counted_and_never_fails_the_generation():
    nc = _Recorder(fail=True)
    batches = TokenBatches(nc, "w1")
    await batches.send(_delta("r1", 0), "gw-a")
    await batches.drain()
    assert batches.dropped == 1 and batches.messages == 0


async def test_requests_sharing_engine_steps_share_messages():
    """Two streamed requests on a simulated engine with shared steps (as vLLM's): every step's two tokens
    arrive in one message, and each request's deltas read back in order, text for text."""
    nc = _Recorder()
    profile = SimProfile(prefill_tok_s=1e6, decode_step_s={1: 0.002, 8: 0.002})
    engine = SimEngine(EngineConfig(model_path="/nonexistent", engine="sim"), profile)
    await engine.start()
    processor = RequestProcessor(worker_id="w1", nc=nc, js=nc, engine=engine, tiers=None, metrics=None, ack_wait_s=30)

    def request(rid: str) -> InferenceRequest:
        sampling = SamplingParams(max_tokens=6)
        return InferenceRequest(
            request_id=rid, tenant_id="t", base_model="b", prompt="hi", stream=True, sampling=sampling, reply_to="gw"
        )

    one, two = await asyncio.gather(processor._generate(request("r1"), None), processor._generate(request("r2"), None))
    assert {subject for subject, _ in nc.sent} == {subjects.token_batch_to("gw", "w1")}
    sizes = [len(json.loads(data)["deltas"]) for _, data in nc.sent]
    assert sizes == [2] * 6, sizes
    texts = {"r1": "", "r2": ""}
    for _, data in nc.sent:
        for d in TokenBatch.model_validate_json(data).deltas:
            texts[d.request_id] += d.text
    assert texts == {"r1": one.text, "r2": two.text}


async def test_the_gateway_hands_each_delta_of_a_batch_to_its_request():
    jobs = {rid: SimpleNamespace(deltas=asyncio.Queue(), rerouted=False, next_delta=0) for rid in ("r1", "r2")}
    jobs["r2"].rerouted = True  # after a re-route the rest comes with the result
    delivery = object.__new__(Delivery)
    delivery.ledger = SimpleNamespace(jobs=jobs)
    delivery.metrics = GatewayMetrics.create(metrics.get_meter("test"))
    batch = TokenBatch(worker_id="w1", deltas=[_delta("r1", 0, "a"), _delta("r2", 0, "b"), _delta("gone", 0)])
    await delivery.on_token(SimpleNamespace(subject=subjects.token_batch_to("gw", "w1"), data=batch.model_dump_json()))
    await delivery.on_token(
        SimpleNamespace(subject=subjects.tokens_to("gw", "r1"), data=_delta("r1", 1, "c").model_dump_json())
    )
    await delivery.on_token(SimpleNamespace(subject=subjects.token_batch_to("gw", "w1"), data=b"not json"))
    assert [jobs["r1"].deltas.get_nowait().text for _ in range(2)] == ["a", "c"]
    assert jobs["r1"].deltas.empty() and jobs["r2"].deltas.empty()


def test_a_batch_subject_is_never_a_request_subject():
    assert subjects.is_token_batch(subjects.token_batch_to("gw", "w1"))
    assert not subjects.is_token_batch(subjects.tokens_to("gw", "steps"))
    assert subjects.token_batch_to("gw", "w1").startswith(subjects.tokens_to_filter("gw")[:-1])
