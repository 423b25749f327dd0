"""The NATS resolve responder fails closed on malformed requests: an error reply, a dead letter with
the reason, and it keeps answering."""

from __future__ import annotations

import uuid

import nats
import pytest

from libs.contracts import ResolveReply, subjects
from libs.contracts.deadline import deadline_headers
from tests.integration.registry.events import dead_letters, wait_until

pytestmark = pytest.mark.integration


async def request(nats_url: str, payload: bytes) -> ResolveReply:
    nc = await nats.connect(nats_url)
    try:
        return ResolveReply.model_validate_json((await nc.request(subjects.RESOLVE, payload, timeout=10)).data)
    finally:
        await nc.drain()


@pytest.mark.parametrize(
    "payload",
    [
        b"not json at all",
        b'{"tenant": "acme"}',
        b'{"schema_version": 2, "tenant": "acme", "alias": "support"}',
        b'{"tenant": "acme", "alias": "support", "extra": 1}',
        b"\xff\xfe\x00",
    ],
)
async def test_malformed_request_gets_an_error_reply_and_a_dead_letter(registry, connections, payload):
    marker = uuid.uuid4().hex
    body = payload.replace(b"acme", f"acme-{marker}".encode()) if b"acme" in payload else payload + marker.encode()
    reply = await request(connections.nats_url, body)
    assert not reply.found and reply.code == "bad_request" and reply.error.startswith("malformed ResolveRequest")

    async def letter():
        return [d for d in await dead_letters(connections.nats_url) if marker in d.payload]

    letters = await wait_until(letter)
    assert letters and letters[0].original_subject == subjects.RESOLVE
    assert letters[0].service == "registry" and "malformed ResolveRequest" in letters[0].reason


async def test_responder_keeps_serving_after_bad_input(registry, connections):
    nc = await nats.connect(connections.nats_url)
    try:
        await nc.publish(subjects.RESOLVE, b"fire and forget garbage")  # no reply subject at all
        await nc.flush()
    finally:
        await nc.drain()
    reply = await request(connections.nats_url, b'{"tenant": "nobody-here", "alias": "x"}')
    assert not reply.found and reply.code == "not_found" and "unknown tenant" in reply.error


async def test_a_request_past_its_deadline_gets_no_reply(registry, connections):
    """A request its asker stopped waiting for (queued behind lookups on a dead database) is skipped: no
    database work and no reply, which the server would refuse as a Publish Violation past 2 minutes. A
    request still awaited is answered."""
    body = b'{"tenant": "nobody-here", "alias": "x"}'
    before = registry.ctx.expired.skipped.get(subjects.RESOLVE, 0)
    nc = await nats.connect(connections.nats_url)
    try:
        with pytest.raises(nats.errors.TimeoutError):
            await nc.request(subjects.RESOLVE, body, timeout=3, headers=deadline_headers(-10.0))
        reply = await nc.request(subjects.RESOLVE, body, timeout=10, headers=deadline_headers(10.0))
    finally:
        await nc.drain()
    assert ResolveReply.model_validate_json(reply.data).code == "not_found"
    # This module's registry is the only responder on the session broker.
    assert registry.ctx.expired.skipped.get(subjects.RESOLVE, 0) == before + 1
