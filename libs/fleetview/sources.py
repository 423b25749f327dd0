"""Reading the fleet: NATS (heartbeats, limit reports, JetStream queues) and Prometheus text over HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
from dataclasses import dataclass, field

from nats.js.errors import BucketNotFoundError, NotFoundError
from pydantic import ValidationError

from libs.contracts import WorkerHeartbeat, subjects
from libs.fleetview.snapshot import ConsumerDepth, StreamDepth
from libs.settings import nats_servers


class FleetUnreachable(RuntimeError):
    """What cannot be reached, in one line for people (no traceback)."""


def describe(exc: BaseException) -> str:
    """A connection failure in a few words: 'connection refused', 'timed out', 'unknown host ...'."""
    if _refused(exc):
        return "connection refused"
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, socket.gaierror):
        return f"unknown host: {exc.strerror or exc}"
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _refused(exc: BaseException | None) -> bool:
    """Refused, here or in what caused it (HTTP clients wrap the socket's error in their own)."""
    seen = 0
    while exc is not None and seen < 5:
        if isinstance(exc, ConnectionRefusedError) or getattr(exc, "errno", None) == errno.ECONNREFUSED:
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


@dataclass
class NatsLink:
    """A plain NATS client for a viewer: no traceback per failed attempt, a first connection that gives
    up as soon as every server refused it (or after `timeout_s`), reconnects on its own after that."""

    url: str
    nc: object = None
    # Connect options (the operator's NATS user); None: the local stack's, from its env file.
    auth: dict | None = None
    errors: list[BaseException] = field(default_factory=list)  # the last few, newest last

    @property
    def js(self):
        return self.nc.jetstream()

    async def connect(self, timeout_s: float = 3.0) -> None:
        import nats

        servers = nats_servers(self.url)
        every_server_failed = asyncio.Event()

        async def on_error(exc: Exception) -> None:  # instead of nats-py's traceback per attempt
            self.errors = [*self.errors[-9:], exc]
            if self.nc is None and len(self.errors) >= len(servers):
                every_server_failed.set()

        # nats-py retries a first connection for ever when reconnects are allowed (they are: a live view
        # outlives a broker restart), so the first attempt is bounded here.
        connecting = asyncio.ensure_future(
            nats.connect(
                servers,
                name="lpx-fleetview",
                connect_timeout=min(2.0, timeout_s),
                reconnect_time_wait=1.0,
                max_reconnect_attempts=-1,
                error_cb=on_error,
                **(self.auth if self.auth is not None else _operator_auth()),
            )
        )
        failing = asyncio.ensure_future(every_server_failed.wait())
        await asyncio.wait({connecting, failing}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        failing.cancel()
        if connecting.done() and connecting.exception() is None:
            self.nc = connecting.result()
        else:
            connecting.cancel()
            with contextlib.suppress(BaseException):
                await connecting
            cause = self.errors[0] if self.errors else TimeoutError()
            raise FleetUnreachable(f"cannot reach NATS at {self.url} ({describe(cause)})")
        try:
            await self.js.account_info()
        except Exception as exc:
            await self.close()
            raise FleetUnreachable(f"NATS at {self.url} answers but not JetStream ({describe(exc)})") from None

    async def close(self) -> None:
        if self.nc is not None and not self.nc.is_closed:
            await self.nc.close()


@dataclass
class Heartbeats:
    beats: dict[str, WorkerHeartbeat]
    unreadable: int = 0  # beats this lpx cannot parse (e.g. a newer worker's)


async def read_heartbeats(js) -> Heartbeats:
    """Every worker's last heartbeat in the bucket (expired ones are gone from it by its TTL). Keys are
    listed from the stream's per-subject counts, as the gateways' pool view does: `KeyValue.keys()`
    would leave an ordered consumer on the server per call."""
    try:
        kv = await js.key_value(subjects.HEARTBEAT_BUCKET)
    except (BucketNotFoundError, NotFoundError):
        return Heartbeats({})  # no worker has ever started on this broker
    prefix = f"$KV.{subjects.HEARTBEAT_BUCKET}."
    info = await js.stream_info(f"KV_{subjects.HEARTBEAT_BUCKET}", subjects_filter=f"{prefix}>")
    keys = sorted(subject.removeprefix(prefix) for subject in (info.state.subjects or {}))
    entries = await asyncio.gather(*(kv.get(key) for key in keys), return_exceptions=True)
    found = Heartbeats({})
    for entry in entries:
        if isinstance(entry, NotFoundError):  # KeyNotFoundError, KeyDeletedError
            continue  # deleted by a drain, or expired since the listing
        if isinstance(entry, BaseException):
            raise entry
        try:
            beat = WorkerHeartbeat.model_validate_json(entry.value)
        except (ValidationError, TypeError):
            found.unreadable += 1
            continue
        found.beats[beat.worker_id] = beat
    return found


async def read_streams(js) -> list[StreamDepth]:
    """Messages in each platform stream and what each of its durable consumers has pending."""
    depths = []
    for spec in subjects.STREAMS:
        try:
            info = await js.stream_info(spec.name)
        except NotFoundError:
            continue  # not created yet (no service has started)
        consumers = [c for c in await _all_consumers(js, spec.name) if c.config.durable_name]
        rows = sorted(
            (ConsumerDepth(c.name, c.num_pending or 0, c.num_ack_pending or 0) for c in consumers),
            key=lambda c: (-(c.pending + c.ack_pending), c.name),
        )
        depths.append(StreamDepth(spec.name, info.state.messages, tuple(rows)))
    return depths


CONSUMER_PAGE = 256  # the most consumers JetStream lists in one answer


async def _all_consumers(js, stream: str) -> list:
    """Every consumer of `stream`, page by page (a fleet has one per worker, past one page when large)."""
    found: list = []
    while True:
        page = await js.consumers_info(stream, offset=len(found))
        found += page
        if len(page) < CONSUMER_PAGE:
            return found


async def scrape(http, url: str) -> str:
    reply = await http.get(url)
    reply.raise_for_status()
    return reply.text


def _operator_auth() -> dict:
    from libs.settings import ConnectionSettings

    return ConnectionSettings.load().nats_auth("admin")
