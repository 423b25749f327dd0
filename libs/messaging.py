"""NATS plumbing shared by the services: stream provisioning, a FastStream broker with tracing,
and the dead-letter path for messages that cannot be processed."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping

import nats
from nats.js.api import KeyValueConfig, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import BadRequestError, BucketNotFoundError, NotFoundError
from pydantic import BaseModel

from libs.connection_state import ConnectionState
from libs.contracts import DeadLetter, subjects
from libs.contracts.subjects import StreamSpec
from libs.settings import nats_servers

log = logging.getLogger(__name__)

_RETENTION = {
    "limits": RetentionPolicy.LIMITS,
    "workqueue": RetentionPolicy.WORK_QUEUE,
    "interest": RetentionPolicy.INTEREST,
}


def stream_config(spec: StreamSpec, replicas: int = 1) -> StreamConfig:
    return StreamConfig(
        name=spec.name,
        description=spec.description or None,
        subjects=list(spec.subjects),
        retention=_RETENTION[spec.retention],
        storage=StorageType.FILE,
        max_age=spec.max_age_s or None,
        duplicate_window=spec.duplicate_window_s,
        num_replicas=replicas,
        allow_direct=spec.allow_direct or None,
    )


class ProvisioningConflict(RuntimeError):
    """A stream exists with a setting that cannot be changed in place. Nothing is deleted: the
    message says which setting differs and what to do."""


# Settings JetStream cannot change on a live stream: a difference is a conflict to report, never a
# reason to delete the stream (and the requests, results and events in it).
_FIXED = ("retention", "storage")


def _conflicts(existing: StreamConfig, wanted: StreamConfig) -> list[str]:
    return [
        f"{name}: the stream has {_plain(getattr(existing, name))}, loraplex needs {_plain(getattr(wanted, name))}"
        for name in _FIXED
        if getattr(existing, name) != getattr(wanted, name)
    ]


def _plain(value) -> str:
    return getattr(value, "value", value)


async def ensure_streams_on(js, specs: Iterable[StreamSpec] = subjects.STREAMS, *, replicas: int = 1) -> None:
    """Create missing streams and bring existing ones to the declared config (idempotent). A stream
    that differs in a setting JetStream cannot change in place raises ProvisioningConflict, naming it."""
    for spec in specs:
        wanted = stream_config(spec, replicas)
        try:
            info = await js.stream_info(spec.name)
        except NotFoundError:
            try:
                await js.add_stream(wanted)
                continue
            except BadRequestError:  # created meanwhile by another service: check it like any other
                info = await js.stream_info(spec.name)
        conflicts = _conflicts(info.config, wanted)
        if conflicts:
            raise ProvisioningConflict(
                f"stream {spec.name} exists with an incompatible config ({'; '.join(conflicts)}). Nothing was "
                f"changed or deleted: move its messages elsewhere if needed, then delete it "
                f"(nats stream rm {spec.name}) and start again"
            )
        try:
            await js.update_stream(wanted)
        except BadRequestError as exc:  # e.g. replicas above the cluster size
            raise ProvisioningConflict(
                f"stream {spec.name} could not be updated to the declared config "
                f"(replicas={replicas}): {exc.description or exc}"
            ) from exc


async def ensure_streams(
    nats_url: str,
    specs: Iterable[StreamSpec] = subjects.STREAMS,
    *,
    replicas: int = 1,
    auth: Mapping[str, str] | None = None,
) -> None:
    """`ensure_streams_on` over a short-lived connection of its own (the stack launcher, tools)."""
    nc = await nats.connect(servers=nats_servers(nats_url), connect_timeout=5, max_reconnect_attempts=3, **(auth or {}))
    try:
        await ensure_streams_on(nc.jetstream(), specs, replicas=replicas)
    finally:
        await nc.drain()


async def ensure_buckets(js, configs: Iterable[KeyValueConfig], *, replicas: int = 1) -> None:
    """Create the KV buckets that are missing. One that exists is left as it is (its first creator
    chose e.g. the heartbeat TTL); a memory-stored bucket lost with a broker restart comes back here."""
    for config in configs:
        try:
            await js.key_value(config.bucket)
            continue
        except (BucketNotFoundError, NotFoundError):
            pass
        try:
            await js.create_key_value(dataclasses.replace(config, replicas=replicas))
            log.info("created KV bucket %s", config.bucket)
        except BadRequestError:  # created meanwhile by another service
            await js.key_value(config.bucket)


def make_broker(nats_url: str, service: str, tracer_provider=None, meter_provider=None, **kwargs):
    """A FastStream NATS broker with OpenTelemetry tracing (trace context rides in headers). `nats_url`
    may list every node of a cluster, comma-separated; pass a BrokerLink's `callbacks()` in kwargs
    to reconnect for ever with one log line per state change."""
    from faststream.nats import NatsBroker
    from faststream.nats.opentelemetry import NatsTelemetryMiddleware

    from libs import nats_compat

    nats_compat.install()  # FastStream's pull loops see nats-py's timeouts as timeouts, not as errors
    middleware = NatsTelemetryMiddleware(tracer_provider=tracer_provider, meter_provider=meter_provider)
    # FastStream logs "Received"/"Processed" for every message at this level: DEBUG, or the registry's
    # log would carry two lines per answered request (usage metering reads every result).
    kwargs.setdefault("log_level", logging.DEBUG)
    if "user" in kwargs:  # the service's NATS user (BrokerLink.callbacks): FastStream takes it as security
        from faststream.security import SASLPlaintext

        kwargs["security"] = SASLPlaintext(username=kwargs.pop("user"), password=kwargs.pop("password"))
        # FastStream refuses credentials in a URL beside `security` (a test's operator URL carries some).
        return NatsBroker(
            [_without_credentials(url) for url in nats_servers(nats_url)],
            middlewares=(middleware,),
            name=f"lpx-{service}",
            **kwargs,
        )
    return NatsBroker(nats_servers(nats_url), middlewares=(middleware,), name=f"lpx-{service}", **kwargs)


def _without_credentials(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    return f"{scheme}{sep}{rest.rpartition('@')[2]}" if sep else url


MAX_DEAD_LETTER_PAYLOAD = 64 * 1024  # characters of the original payload kept in a dead letter
MAX_DEAD_LETTER_HEADER = 1024


def dead_letter(
    service: str, subject: str, reason: str, payload: bytes | str | BaseModel, headers: Mapping[str, str] | None = None
) -> DeadLetter:
    """The dead-letter record for a message that could not be processed, reason included."""
    if isinstance(payload, BaseModel):
        text = payload.model_dump_json()
    elif isinstance(payload, bytes):
        text = payload.decode("utf-8", errors="replace")
    else:
        text = payload
    size = len(payload) if isinstance(payload, bytes) else len(text.encode("utf-8", errors="replace"))
    # Kept short enough to be publishable whatever came in: a payload near the broker's limit, or bytes
    # that triple once decoded with replacement characters, would make the letter itself unpublishable
    # (and the message it stands for would be redelivered for ever).
    kept = {str(k)[:200]: str(v)[:MAX_DEAD_LETTER_HEADER] for k, v in list((headers or {}).items())[:64]}
    return DeadLetter(
        service=service,
        original_subject=subject[:1000],
        reason=reason[:4000],
        payload=text[:MAX_DEAD_LETTER_PAYLOAD],
        payload_bytes=size,
        truncated=len(text) > MAX_DEAD_LETTER_PAYLOAD,
        headers=kept,
    )


class JetStreamPublisher:
    """The `publish(message, subject, stream, timeout)` of a FastStream broker, over a plain nats-py
    JetStream context (for DeadLetterPublisher in services that do not run a FastStream broker)."""

    def __init__(self, js) -> None:
        self.js = js

    async def publish(self, message: BaseModel, subject: str, stream: str, timeout: float) -> None:
        await self.js.publish(subject, message.model_dump_json().encode(), stream=stream, timeout=timeout)


class DeadLetterPublisher:
    """Publish dead letters of one service on subjects.dead_letter(service) (kept by the DLQ stream).
    Losing a letter is logged, never raised: it must not take the failing handler down with it."""

    def __init__(self, broker, service: str) -> None:
        self.broker = broker
        self.service = service
        self.subject = subjects.dead_letter(service)

    async def send(
        self, original_subject: str, reason: str, payload: bytes | str, headers: Mapping[str, str] | None = None
    ) -> None:
        letter = dead_letter(self.service, original_subject, reason, payload, headers)
        log.warning("dead letter from %s: %s", original_subject, reason)
        try:
            await self.broker.publish(letter, self.subject, stream=subjects.DLQ_STREAM, timeout=5)
        except Exception:
            log.exception("could not publish a dead letter for %s", original_subject)


async def serve_one_at_a_time(
    sub, handle: Callable[[object], Awaitable[None]], stopping: asyncio.Event, retry_delay_s: float
) -> None:
    """Pull one message at a time from a durable pull subscription and `handle` it, until `stopping`.
    An exception in `handle` is a transient failure: the message is NAKed with a delay (redelivered)."""
    from nats.errors import TimeoutError as NatsTimeout

    state = ConnectionState("work queue")
    while not stopping.is_set():
        try:
            msgs = await sub.fetch(batch=1, timeout=1.0)
        except (TimeoutError, NatsTimeout):
            state.ok()
            continue
        except Exception as exc:
            state.failed(exc)
            await asyncio.sleep(1.0)
            continue
        state.ok()
        for msg in msgs:
            try:
                await handle(msg)
            except Exception:
                log.exception("handling %s failed; it will be redelivered", msg.subject)
                with contextlib.suppress(Exception):
                    await msg.nak(delay=retry_delay_s)


@contextlib.asynccontextmanager
async def kept_in_progress(msg, ack_wait_s: float):
    """While the block runs, tell JetStream every ack_wait/3 that `msg` is still being worked on."""

    async def beat() -> None:
        while True:
            await asyncio.sleep(max(1.0, ack_wait_s / 3))
            with contextlib.suppress(Exception):
                await msg.in_progress()

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
