"""One accepted request while the gateway waits for its first result."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from opentelemetry import context as otel_context

from libs.contracts import InferenceRequest
from libs.routing import RouteDecision

BASE_TOKEN = "base"  # the routing token of a base-model request (no adapter)


@dataclass
class Job:
    """One accepted request, until its first result (or its deadline)."""

    request: InferenceRequest
    pool: str
    token: str  # adapter digest, or 'base'
    expected_digest: str | None
    worker: str  # current assignment; subjects.ANY_WORKER when handed to the whole pool
    future: asyncio.Future
    deltas: asyncio.Queue | None = None
    attempts: int = 1
    rerouted: bool = False
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
