"""Skip NATS requests whose asker has stopped waiting (libs.contracts.deadline).

Why: each responder subscription handles one request at a time. While PostgreSQL is down a lookup
can take up to the driver's 60 s connect timeout, so requests queue behind it, and by the time one
is handled its asker (a gateway waiting 2-5 s) is long gone. Answering it costs a database round
trip per dead request and, past 2 minutes, the server refuses the reply. A read-only lookup is also
cut off when its asker's deadline passes mid-way.
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
    """Counts the requests skipped per subject (read by tests and the log)."""

    def __init__(self) -> None:
        self.skipped: dict[str, int] = {}

    def skip(self, subject: str, why: str) -> SkipMessage:
        self.skipped[subject] = self.skipped.get(subject, 0) + 1
        log.info("%s: skipped a request %s (its asker no longer waits)", subject, why)
        return SkipMessage()


async def answer_in_time(expired: Expired, subject: str, headers, work: Awaitable[T], *, cut_off: bool = True) -> T:
    """`work`'s answer, unless the asker's deadline has passed: then SkipMessage, and FastStream sends
    no reply. `cut_off`: also cancel `work` at the deadline (read-only work only: a write cut off
    mid-way would leave the asker unsure whether it happened)."""
    left = seconds_left(headers)
    if left is None:
        return await work
    if left <= 0:
        if asyncio.iscoroutine(work):
            work.close()  # never started: no "never awaited" warning
        raise expired.skip(subject, f"{-left:.1f} s past its deadline")
    if not cut_off:
        return await work
    limit = asyncio.timeout(left)
    try:
        async with limit:
            return await work
    except TimeoutError:
        if not limit.expired():
            raise  # the work's own timeout, not the deadline
        raise expired.skip(subject, "whose deadline passed while it was handled") from None
