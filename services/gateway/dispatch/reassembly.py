"""Stream reassembly: a streamed request's token deltas in order, then its checked final result.

A worker streams deltas while it generates; the final result carries the whole text. What the
deltas did not cover comes as one last delta before the result. After a re-route (the first worker
died mid-stream) the deltas of the new worker are not forwarded: the rest of the text comes with the
final result, and a final text that does not continue what was already sent (sampling on the second
worker) is an error, never a spliced answer."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable

from libs.contracts import InferenceResult, TokenDelta
from services.gateway import errors
from services.gateway.dispatch.delivery import check_result
from services.gateway.dispatch.job import Job
from services.gateway.errors import GatewayError
from services.gateway.metrics import GatewayMetrics


async def events(
    job: Job, deadline: float, abandon: Callable[[Job], None], metrics: GatewayMetrics
) -> AsyncIterator[TokenDelta | InferenceResult]:
    """Deltas in order (text, and token logprobs when asked for), then the checked final result (what
    of it was not yet sent comes as one last delta). Raises GatewayError like `Delivery.wait`."""
    sent, sent_logprobs = "", 0
    queue = job.deltas
    assert queue is not None, "events() needs a job submitted with stream=True"
    try:
        while not job.future.done():
            delta = queue.get_nowait() if not queue.empty() else await _next_delta(job, deadline, abandon)
            if delta is not None and not job.rerouted:
                sent, sent_logprobs = sent + delta.text, sent_logprobs + len(delta.logprobs or ())
                yield delta
        while not queue.empty() and not job.rerouted:
            delta = queue.get_nowait()
            sent, sent_logprobs = sent + delta.text, sent_logprobs + len(delta.logprobs or ())
            yield delta
        result = check_result(job, job.future.result(), metrics)
    except BaseException:
        if not job.future.done():
            abandon(job)
        raise
    if result.text.startswith(sent):
        rest = result.text[len(sent) :]
        rest_logprobs = result.logprobs[sent_logprobs:] if result.logprobs is not None else None
        if rest or rest_logprobs:
            yield TokenDelta(request_id=result.request_id, index=-1, text=rest, logprobs=rest_logprobs)
    else:  # text already streamed differs from the final answer (a re-route with sampling)
        raise GatewayError(
            502,
            "the request was re-routed after a worker failure and the new answer "
            "differs from the part already streamed",
            "stream_diverged",
        )
    yield result


async def _next_delta(job: Job, deadline: float, abandon: Callable[[Job], None]) -> TokenDelta | None:
    """The next delta, or None once the result came first (or a wait ended at the deadline, which the next
    call raises). Only an empty queue is waited on: a batch of deltas arrives per engine step."""
    remaining = deadline - time.time()
    if remaining <= 0:
        abandon(job)
        raise errors.deadline(deadline - job.request.submitted_at)
    await job.deltas.wait(job.future, remaining)
    return None if job.deltas.empty() else job.deltas.get_nowait()
