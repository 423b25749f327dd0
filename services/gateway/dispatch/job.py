"""One accepted request while the gateway waits for its first result."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field

from opentelemetry import context as otel_context

from libs.contracts import InferenceRequest
from libs.routing import RouteDecision

BASE_TOKEN = "base"  # the routing token of a base-model request (no adapter)


class DeltaQueue:
    """A streamed request's token deltas as they arrive, for one reader.

    Not asyncio.Queue: the reader waits for "a delta or the final result, whichever comes first", and with a
    Queue that took a Task per token (its get() under asyncio.wait) and three loop hops from the message to
    the reader. Here the writer resolves one plain future: one hop, no Task (bench_token_path measures it)."""

    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: deque = deque()
        self._waiter: asyncio.Future | None = None

    def put_nowait(self, item) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def get_nowait(self):
        return self._items.popleft()

    def empty(self) -> bool:
        return not self._items

    async def wait(self, result: asyncio.Future, timeout: float) -> None:
        """Until a delta is queued or `result` is done, or `timeout` seconds pass."""
        if self._items or result.done():
            return
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()

        def wake(*_) -> None:
            if not waiter.done():
                waiter.set_result(None)

        result.add_done_callback(wake)
        timer = loop.call_later(timeout, wake)
        try:
            await waiter
        finally:
            self._waiter = None
            timer.cancel()
            result.remove_done_callback(wake)


@dataclass
class Job:
    """One accepted request, until its first result (or its deadline)."""

    request: InferenceRequest
    pool: str
    token: str  # adapter digest, or 'base'
    expected_digest: str | None
    worker: str  # current assignment; subjects.ANY_WORKER when handed to the whole pool
    future: asyncio.Future
    deltas: DeltaQueue | None = None
    attempts: int = 1
    rerouted: bool = False
    # The index the next streamed delta must carry; None once one was missed (token deltas are core NATS:
    # a broker restart can lose some): then the rest of the text comes with the final result.
    next_delta: int | None = 0
    accepted_at: float = field(default_factory=time.monotonic)
    # Stage timeline stamps (unix seconds; see services.gateway.timeline).
    publish_started_at: float | None = None
    published_at: float | None = None
    received_at: float | None = None
    decision: RouteDecision | None = None
    # The caller's trace: a re-route after a worker dies publishes in the same trace, not a new one.
    trace_context: otel_context.Context = field(default_factory=otel_context.get_current)

    @property
    def request_id(self) -> str:
        return self.request.request_id
