"""When a worker may skip its duplicate lookup: only the gateway's own first dispatch of an id it
minted (mark and Nats-Msg-Id), on its first delivery, soon after it was sent."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from libs.contracts import FRESH_REQUEST_HEADER, InferenceRequest, first_dispatch_id
from services.worker.freshness import FRESH_WINDOW_S, skips_duplicate_lookup

NOW = 1_000_000.0


@dataclass
class Meta:
    num_delivered: int = 1


@dataclass
class Msg:
    headers: dict | None
    metadata: Meta = field(default_factory=Meta)


def request(sent_at: float = NOW - 0.05) -> InferenceRequest:
    return InferenceRequest(
        request_id="r1", tenant_id="acme", base_model="llama", prompt="hi", submitted_at=sent_at, reply_to="gw-a"
    )


def fresh_headers(**extra) -> dict:
    return {FRESH_REQUEST_HEADER: "1", "Nats-Msg-Id": first_dispatch_id("r1", "gw-a"), **extra}


def test_the_gateways_fresh_first_dispatch_skips_the_lookup():
    assert skips_duplicate_lookup(Msg(fresh_headers()), request(), NOW)


def test_anything_unsure_runs_the_lookup():
    req = request()
    assert not skips_duplicate_lookup(Msg(None), req, NOW)  # an older gateway, or an async submission
    assert not skips_duplicate_lookup(Msg({"Nats-Msg-Id": first_dispatch_id("r1", "gw-a")}), req, NOW)
    for copied in ("r1@gw-a-handoff-w1", "r1@gw-a-bound-w2", "r1-reroute-2"):  # copies keep the mark
        assert not skips_duplicate_lookup(Msg(fresh_headers(**{"Nats-Msg-Id": copied})), req, NOW)
    assert not skips_duplicate_lookup(Msg(fresh_headers(), Meta(num_delivered=2)), req, NOW)  # redelivered
    assert not skips_duplicate_lookup(Msg(fresh_headers()), request(NOW - FRESH_WINDOW_S - 0.1), NOW)  # waited
    assert not skips_duplicate_lookup(Msg(fresh_headers()), request(NOW + 5), NOW)  # a clock far ahead
    assert skips_duplicate_lookup(Msg(fresh_headers()), request(NOW + 0.2), NOW)  # the gateway's a little ahead


def test_a_message_without_jetstream_metadata_runs_the_lookup():
    class Core:
        headers = fresh_headers()

        @property
        def metadata(self):
            raise ValueError("not a JetStream message")

    assert not skips_duplicate_lookup(Core(), request(), NOW)
    assert skips_duplicate_lookup(Msg(fresh_headers()), request(time.time()))  # now defaults to the clock


class _Broker:
    """The worker's NATS and JetStream sides: results published, lookups of stored results counted."""

    max_payload = 1024 * 1024

    def __init__(self, stored: bool = False) -> None:
        self.stored, self.lookups, self.sent = stored, [], []

    async def get_last_msg(self, stream: str, subject: str):
        from nats.js.errors import NotFoundError

        self.lookups.append(subject)
        if not self.stored:
            raise NotFoundError
        return object()

    async def publish(self, subject: str, data: bytes, **_) -> None:
        self.sent.append(subject)


@dataclass
class _Delivered(Msg):
    data: bytes = b""
    acked: int = 0

    async def ack(self) -> None:
        self.acked += 1


def _processor(broker: _Broker, generated: list):
    from types import SimpleNamespace

    from libs.contracts import InferenceResult
    from services.worker.processor import RequestProcessor

    counter = SimpleNamespace(add=lambda *a, **k: None)
    metrics = SimpleNamespace(requests=counter)
    processor = RequestProcessor(
        worker_id="w1", nc=broker, js=broker, engine=None, tiers=None, metrics=metrics, ack_wait_s=30
    )

    async def process(request, msg, fetched_at):
        generated.append(request.request_id)
        return InferenceResult(request_id=request.request_id, worker_id="w1", ok=True, text="ahoy")

    processor._process = process
    return processor


async def test_the_worker_looks_up_stored_answers_except_for_a_fresh_first_dispatch():
    req = request(time.time())
    for headers, stored, looked_up, generated_it in (
        (fresh_headers(), False, False, True),  # fresh: straight to the engine
        (None, False, True, True),  # unmarked: looked up, not found, generated
        (None, True, True, False),  # unmarked and answered before: acked, not generated again
        (fresh_headers(**{"Nats-Msg-Id": "r1@gw-a-handoff-w2"}), True, True, False),  # a copy: looked up
    ):
        broker, generated = _Broker(stored), []
        msg = _Delivered(headers, data=req.model_dump_json().encode())
        await _processor(broker, generated).handle(msg)
        assert bool(broker.lookups) == looked_up and bool(generated) == generated_it, headers
        assert msg.acked == 1
