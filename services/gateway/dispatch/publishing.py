"""Publishing routed work: the InferenceRequest to its worker's subject on JetStream.

Nats-Msg-Id makes a retry stored once; the trace context travels in the headers (the worker continues
the caller's trace, and a re-route publishes in the same trace). While the broker is away the publish
is retried with the same id for `publish_retry_s`, never past the request's deadline."""

from __future__ import annotations

import time

from opentelemetry import trace

from libs.bus.retry import publish_retrying
from libs.contracts import FRESH_REQUEST_HEADER, first_dispatch_id
from libs.telemetry import inject_headers
from services.gateway.dispatch.job import Job


class Publisher:
    def __init__(self, js, tracer: trace.Tracer, *, gateway_id: str | None, retry_s: float) -> None:
        self.js = js
        self.tracer = tracer
        self.gateway_id = gateway_id
        self.retry_s = retry_s

    def msg_id(self, request_id: str) -> str:
        """Nats-Msg-Id of a first dispatch (`first_dispatch_id`)."""
        return first_dispatch_id(request_id, self.gateway_id)

    async def publish(self, job: Job, subject: str, msg_id: str, *, fresh: bool = False) -> None:
        """`fresh`: the first dispatch of a request id this gateway minted (FRESH_REQUEST_HEADER)."""
        with self.tracer.start_as_current_span(
            "gateway.publish",
            context=job.trace_context,
            kind=trace.SpanKind.PRODUCER,
            attributes={
                "messaging.system": "nats",
                "messaging.destination.name": subject,
                "lpx.request_id": job.request_id,
                "lpx.worker": job.worker,
                "lpx.pool": job.pool,
                "lpx.attempt": job.attempts,
            },
        ):
            headers = inject_headers({"Nats-Msg-Id": msg_id, **({FRESH_REQUEST_HEADER: "1"} if fresh else {})})
            give_up_at = time.time() + self.retry_s
            if job.request.deadline is not None:
                give_up_at = min(give_up_at, job.request.deadline)
            await publish_retrying(
                self.js, subject, job.request.model_dump_json().encode(), headers=headers, give_up_at=give_up_at
            )
