"""What counts as "the broker is away" (worth another try), and the publish and read that retry
through it: a JetStream publish that fails while the broker is away or electing a leader is retried
with backoff and the same Nats-Msg-Id, so the stream stores it once however many tries it took."""

from __future__ import annotations

import asyncio
import time

from nats import errors as nats_errors
from nats.js import errors as js_errors
from tenacity import AsyncRetrying, retry_if_exception, stop_after_delay, wait_exponential

# Failures that mean "the broker is away, restarting or electing a leader": worth another try.
TRANSIENT = (
    nats_errors.TimeoutError,
    nats_errors.NoRespondersError,
    nats_errors.ConnectionReconnectingError,
    nats_errors.OutboundBufferLimitError,
    nats_errors.StaleConnectionError,
    nats_errors.FlushTimeoutError,
    js_errors.NoStreamResponseError,
    js_errors.ServiceUnavailableError,
    js_errors.ServerError,
    asyncio.TimeoutError,
    ConnectionError,
    OSError,
)


def is_transient(exc: BaseException) -> bool:
    """True for failures that another try after a pause can cure. A stream reported missing counts:
    right after a broker restart the service's re-provisioning may not have run yet."""
    if isinstance(exc, js_errors.NotFoundError) and not isinstance(exc, js_errors.KeyValueError):
        return True
    if isinstance(exc, js_errors.APIError) and exc.code in (503, 504):
        return True
    return isinstance(exc, TRANSIENT)


async def publish_retrying(
    js,
    subject: str,
    payload: bytes,
    *,
    headers: dict[str, str],
    give_up_at: float,
    stream: str | None = None,
    attempt_timeout_s: float = 2.0,
):
    """A JetStream publish retried with backoff until it is acknowledged or `give_up_at` (a time.time()
    instant) passes. `headers` must carry the Nats-Msg-Id: every try is the same message to JetStream,
    so one that was stored although its acknowledgement was lost is not stored twice."""
    if "Nats-Msg-Id" not in headers:
        raise ValueError("publish_retrying needs a Nats-Msg-Id header (de-duplication across tries)")
    try:  # the first try outside tenacity: its retry state costs more CPU than the publish on the hot path
        return await _publish_once(js, subject, payload, headers, give_up_at, stream, attempt_timeout_s)
    except Exception as exc:
        if not is_transient(exc) or time.time() >= give_up_at:
            raise
    await asyncio.sleep(0.1)  # the backoff's first step
    budget = max(0.05, give_up_at - time.time())
    async for attempt in AsyncRetrying(
        retry=retry_if_exception(is_transient),
        stop=stop_after_delay(budget),
        wait=wait_exponential(multiplier=0.1, max=2.0),
        reraise=True,
    ):
        with attempt:
            return await _publish_once(js, subject, payload, headers, give_up_at, stream, attempt_timeout_s)
    raise AssertionError("unreachable")  # pragma: no cover


async def _publish_once(js, subject, payload, headers, give_up_at, stream, attempt_timeout_s):
    timeout = max(0.05, min(attempt_timeout_s, give_up_at - time.time()))
    return await js.publish(subject, payload, headers=headers, stream=stream, timeout=timeout)


async def last_message(js, stream: str, subject: str, *, within_s: float = 20.0):
    """The last message stored on `subject`, or None if there is none. Retried while the broker is away
    or electing the stream's leader (a timeout is no answer); past `within_s` the error propagates."""
    async for attempt in AsyncRetrying(
        retry=retry_if_exception(is_transient),
        stop=stop_after_delay(within_s),
        wait=wait_exponential(multiplier=0.1, max=2),
        reraise=True,
    ):
        with attempt:
            try:
                return await js.get_last_msg(stream, subject)
            except js_errors.NotFoundError:
                return None
    return None  # pragma: no cover - AsyncRetrying returns or raises
