"""A worker's results on their way out: stamped, published once (JetStream's duplicate window), retried
while the broker is away, and replaced by an error a caller can act on when too big for one message."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from libs.bus.retry import publish_retrying
from libs.contracts import ErrorInfo, InferenceRequest, InferenceResult, subjects
from libs.telemetry import inject_headers

log = logging.getLogger(__name__)
# A result is retried at least this long while the broker is away, and until the request's deadline.
RESULT_RETRY_S = 60.0


def publish_deadline(request: InferenceRequest) -> float:
    return max(time.time() + RESULT_RETRY_S, request.deadline or 0.0)


class ResultPublisher:
    def __init__(self, worker_id: str, nc, js) -> None:
        self.worker_id, self.nc, self.js = worker_id, nc, js

    async def publish(
        self,
        result: InferenceResult,
        reply_to: str | None,
        give_up_at: float | None = None,
        on_stamped: Callable[[], Awaitable[None]] | None = None,
        on_leaving: Callable[[], Awaitable[float | None]] | None = None,
    ) -> None:
        # Nats-Msg-Id: a result re-published after a crash between publish and ack, or retried while the
        # broker is away, is stored once. Past `give_up_at` the error propagates and the request stays
        # unacknowledged: JetStream redelivers it and the result is published again then.
        # The pool hears that the request leaves before the stamp the fleet's load is counted by: no other
        # worker then counts it after its stamp (that would raise its bound over the true one).
        left_at = await on_leaving() if on_leaving is not None else None
        stamped = result.timings.model_copy(update={"result_sent_at": time.time(), "load_left_at": left_at})
        result = result.model_copy(update={"timings": stamped})
        if on_stamped is not None:  # the worker's own count drops with the stamp
            await on_stamped()
        subject = subjects.result_subject(result.request_id, reply_to)
        data = result.model_dump_json().encode()
        if len(data) > max_payload(self.nc):  # never retried for ever: the caller gets the reason instead
            data = self.too_large(result, len(data)).model_dump_json().encode()
        await publish_retrying(
            self.js,
            subject,
            data,
            headers=inject_headers({"Nats-Msg-Id": f"result-{result.request_id}"}),
            give_up_at=give_up_at or time.time() + RESULT_RETRY_S,
        )

    def too_large(self, result: InferenceResult, size: int) -> InferenceResult:
        log.warning("result over the broker's message limit", extra={"request_id": result.request_id, "bytes": size})
        reason = (
            f"the answer ({size} bytes with its logprobs) is over the broker's message limit; ask for "
            "fewer tokens or fewer logprob alternatives"
        )
        return InferenceResult(
            request_id=result.request_id,
            worker_id=self.worker_id,
            ok=False,
            error=ErrorInfo(code="result_too_large", message=reason),
            timings=result.timings,
            tenant=result.tenant,
            adapter_digest=result.adapter_digest,
            base_model=result.base_model,
        )


def max_payload(nc) -> int:
    """The broker's message limit as the connection learnt it (1 MiB when unknown), less room for headers."""
    limit = getattr(nc, "max_payload", 0) or 1024 * 1024
    return limit - 4096
