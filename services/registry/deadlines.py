"""Skip NATS requests nobody can get the answer to (libs.contracts.deadline).

Why: each responder subscription handles one request at a time. While PostgreSQL is down a lookup
can take up to the driver's 60 s connect timeout, so requests queue behind it, and by the time one
is handled its asker (a gateway waiting 2-5 s) is long gone. Answering it costs a database round
trip per dead request and, past 2 minutes, the server refuses the reply (`allow_responses` expiry),
logged as a Publish Violation. A read-only lookup is also cut off when its asker's deadline passes.

Nor is a reply sent when the connection the request came on was lost meanwhile: the server grants the
reply right to that connection alone, and nats-py would send a reply written during the reconnect on
the new connection, to be refused the same way.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import TypeVar

from faststream.exceptions import SkipMessage

from libs.contracts.deadline import seconds_left

log = logging.getLogger(__name__)
T = TypeVar("T")


class Expired:
    """Counts the requests skipped per subject, whatever the reason (read by tests; the log says why)."""

    def __init__(self) -> None:
        self.skipped: dict[str, int] = {}

    def skip(self, subject: str, why: str) -> SkipMessage:
        self.skipped[subject] = self.skipped.get(subject, 0) + 1
        log.info("%s: no reply to a request %s", subject, why)
        return SkipMessage()


def connection_session(nc) -> int | None:
    """Which connection of the client is up: its reconnect count; None while it is not connected."""
    if nc is None or not nc.is_connected:
        return None
    return nc.stats["reconnects"]


async def answer_in_time(
    expired: Expired, subject: str, headers, work: Awaitable[T], *, cut_off: bool = True, link=None
) -> T:
    """`work`'s answer, unless the asker's deadline has passed: then SkipMessage, and FastStream sends
    no reply. `cut_off`: also cancel `work` at the deadline (read-only work only: a write cut off
    mid-way would leave the asker unsure whether it happened). `link`: the broker link (libs.bus) whose
    client the request came in on; when its connection was lost while the work ran, no reply either."""
    nc = getattr(link, "nc", None)
    session = connection_session(nc)
    answer = await _within_deadline(expired, subject, headers, work, cut_off)
    if nc is not None and (session is None or connection_session(nc) != session):
        raise expired.skip(subject, "whose connection was lost while it was handled")
    return answer


async def _within_deadline(expired: Expired, subject: str, headers, work: Awaitable[T], cut_off: bool) -> T:
    left = seconds_left(headers)
    if left is None:
        return await work
    if left <= 0:
        if asyncio.iscoroutine(work):
            work.close()  # never started: no "never awaited" warning
        raise expired.skip(subject, f"{-left:.1f} s past its asker's deadline")
    if not cut_off:
        return await work
    limit = asyncio.timeout(left)
    try:
        async with limit:
            return await work
    except TimeoutError:
        if not limit.expired():
            raise  # the work's own timeout, not the deadline
        raise expired.skip(subject, "whose asker's deadline passed while it was handled") from None
