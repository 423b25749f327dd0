"""Living with the broker: connecting, losing it, getting it back.

Every service holds one `BrokerLink`. It connects to every NATS node it is given (retrying with
backoff at start instead of crashing), reconnects for ever, and logs one line per state change
(lost, reconnected, re-provisioned), never a traceback per attempt. After each reconnect it
re-provisions, idempotently, what the service needs (streams, KV buckets: a broker restarted
without its memory-stored buckets, or a fresh cluster, gets them back) and then runs the service's
own reconnect hooks (e.g. the gateway looks up results it may have missed while away).

Hand-written around nats-py's own reconnect logic (which does the socket work): nats-py reports
state through callbacks, and what to do on each is ours. Retries use tenacity.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence

import nats
from nats import errors as nats_errors
from nats.js.api import KeyValueConfig
from tenacity import AsyncRetrying, retry_if_exception, stop_after_delay, wait_exponential

from libs.bus.provision import ProvisioningConflict, ensure_buckets, ensure_streams_on
from libs.bus.retry import is_transient
from libs.bus.state import ConnectionState
from libs.bus.state import describe as _describe
from libs.contracts import subjects
from libs.contracts.subjects import StreamSpec
from libs.settings import ConnectionSettings

log = logging.getLogger(__name__)

Hook = Callable[[], Awaitable[None]]


def quiet_callbacks(what: str) -> dict:
    """nats-py callbacks for a plain client (e.g. libs.client): one line when the connection is lost,
    one when it is back, instead of nats-py's default traceback per failed reconnect attempt."""
    state = ConnectionState(what)

    async def on_error(exc: Exception) -> None:
        state.failed(exc)

    async def on_disconnected() -> None:
        state.failed("connection lost, reconnecting")

    async def on_reconnected() -> None:
        state.ok()

    return dict(error_cb=on_error, disconnected_cb=on_disconnected, reconnected_cb=on_reconnected)


class BrokerLink:
    """A NATS connection that survives broker restarts, outages and leader elections."""

    def __init__(
        self,
        connections: ConnectionSettings,
        name: str,
        *,
        streams: Sequence[StreamSpec] = subjects.STREAMS,
        buckets: Sequence[KeyValueConfig] = (),
        reconnect_wait_s: float = 0.5,
        role: str | None = None,
    ) -> None:
        self.connections = connections
        self.name = name
        # The NATS user it connects as (libs/natsauth/permissions.py); the link's name by default.
        self.role = role or name
        self.streams = tuple(streams)
        self.buckets = list(buckets)
        self.consumers: list[tuple[str, object]] = []  # (stream, ConsumerConfig) of durable consumers
        self.reconnect_wait_s = reconnect_wait_s
        self.nc: nats.NATS | None = None
        self.js = None
        self.state = ConnectionState(f"NATS ({name})")
        self.reconnects = 0
        self._on_lost: list[Callable[[], None]] = []
        self._on_back: list[Hook] = []
        self._back_task: asyncio.Task | None = None
        self._closing = False

    # --- hooks the service registers -----------------------------------------------------------
    def on_lost(self, callback: Callable[[], None]) -> None:
        """Called (synchronously) when the connection drops."""
        self._on_lost.append(callback)

    def on_back(self, hook: Hook) -> None:
        """Awaited after each reconnect, once streams and buckets are provisioned again."""
        self._on_back.append(hook)

    def add_consumer(self, stream: str, config) -> None:
        """A durable consumer to re-create after a reconnect if the broker lost it (same config:
        JetStream treats the create as a no-op when it exists)."""
        self.consumers.append((stream, config))

    def callbacks(self) -> dict:
        """nats-py connection options for a client this link does not create itself (the registry's
        FastStream broker): reconnect for ever and report state here. Then `attach` the connection."""
        return dict(
            **self.connections.nats_auth(self.role),
            max_reconnect_attempts=-1,
            reconnect_time_wait=self.reconnect_wait_s,
            error_cb=self._on_error,
            disconnected_cb=self._on_disconnected,
            reconnected_cb=self._on_reconnected,
            closed_cb=self._on_closed,
        )

    async def attach(self, nc) -> None:
        """Adopt a connection made with `callbacks()` and provision what the service needs."""
        self.nc = nc
        self.js = nc.jetstream()
        refuse_open_broker(nc, self.connections, self.name)
        await self._provision_patiently()

    @property
    def connected(self) -> bool:
        return self.nc is not None and self.nc.is_connected

    # --- connecting ----------------------------------------------------------------------------
    async def connect(self, *, give_up_after_s: float | None = None) -> nats.NATS:
        """Connect to any of the configured nodes, retrying with backoff (one line per attempt)
        until it works or `give_up_after_s` passes; then provision streams and buckets."""
        urls = self.connections.nats_servers
        stop = stop_after_delay(give_up_after_s) if give_up_after_s is not None else (lambda _state: False)
        async for attempt in AsyncRetrying(
            retry=retry_if_exception(_connect_failure),
            stop=stop,
            reraise=True,
            wait=wait_exponential(multiplier=0.5, max=10),
            before_sleep=self._log_connect_retry,
        ):
            with attempt:
                self.nc = await nats.connect(
                    servers=urls, name=f"lpx-{self.name}", connect_timeout=3, allow_reconnect=True, **self.callbacks()
                )
        self.js = self.nc.jetstream()
        self.state.ok()
        refuse_open_broker(self.nc, self.connections, self.name)
        await self._provision_patiently()
        log.info("connected to NATS", extra={"service": self.name, "url": _netloc(self.nc)})
        return self.nc

    def _log_connect_retry(self, retry_state) -> None:
        exc = retry_state.outcome.exception()
        wait = retry_state.next_action.sleep if retry_state.next_action else 0
        log.warning(
            "NATS not reachable at %s (%s); retrying in %.1fs",
            ",".join(self.connections.nats_servers),
            _describe(exc),
            wait,
        )

    async def _provision_patiently(self, within_s: float = 60.0) -> None:
        """Provision, retrying what a cluster still electing its leaders answers (a conflicting stream
        config is not retried: it is raised with its explanation)."""
        async for attempt in AsyncRetrying(
            retry=retry_if_exception(is_transient),
            stop=stop_after_delay(within_s),
            wait=wait_exponential(multiplier=0.2, max=3),
            reraise=True,
        ):
            with attempt:
                await self.provision()

    async def provision(self) -> None:
        """Streams and this service's KV buckets, created or brought to the declared config."""
        replicas = self.connections.nats_replicas
        await ensure_streams_on(self.js, self.streams, replicas=replicas)
        await ensure_buckets(self.js, self.buckets, replicas=replicas)
        for stream, config in self.consumers:
            await self.js.add_consumer(stream, config=config)

    def closing(self) -> None:
        """The service is shutting its connection down: what follows is not an outage."""
        self._closing = True

    async def close(self) -> None:
        self._closing = True
        if self._back_task:
            self._back_task.cancel()
        if self.nc is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.nc.drain(), 15)
            with contextlib.suppress(Exception):
                await self.nc.close()

    # --- nats-py callbacks ---------------------------------------------------------------------
    async def _on_error(self, exc: Exception) -> None:
        # nats-py reports every failed reconnect attempt here; the state change is what matters.
        if self.connected:
            log.debug("NATS client error: %s", _describe(exc))
        else:
            self.state.failed(exc)

    async def _on_disconnected(self) -> None:
        if self._closing:
            return
        self.state.failed("connection lost, reconnecting")
        for callback in self._on_lost:
            try:
                callback()
            except Exception:
                log.exception("on_lost hook failed")

    async def _on_reconnected(self) -> None:
        self.reconnects += 1
        self.state.ok()
        log.info("NATS reconnected", extra={"service": self.name, "url": _netloc(self.nc)})
        if self._back_task is None or self._back_task.done():
            self._back_task = asyncio.create_task(self._after_reconnect(), name=f"{self.name}-reprovision")

    async def _on_closed(self) -> None:
        if not self._closing:
            log.error("NATS connection closed for good", extra={"service": self.name})

    async def _after_reconnect(self) -> None:
        """Re-provision (until it works: a cluster may still be electing) and run the hooks."""
        wait = 0.2
        while not self._closing:
            try:
                await self.provision()
                break
            except Exception as exc:
                if isinstance(exc, ProvisioningConflict):
                    log.error("%s", exc)
                else:
                    log.debug("re-provisioning failed: %s", _describe(exc))
                await asyncio.sleep(wait)
                wait = min(wait * 2, 5.0)
        log.info(
            "re-provisioned streams and buckets",
            extra={"service": self.name, "buckets": [b.bucket for b in self.buckets]},
        )
        for hook in self._on_back:
            try:
                await hook()
            except Exception:
                log.exception("on_back hook failed")


class OpenBrokerRefused(RuntimeError):
    """The broker lets anyone connect without credentials: any client could read every tenant's
    answers and forge work. Refused unless LPX_NATS_ALLOW_OPEN says this is intended."""


def refuse_open_broker(nc, connections: ConnectionSettings, name: str) -> None:
    """The server says in its INFO whether it requires authentication; without it, refuse to start."""
    info = getattr(nc, "_server_info", None) or {}
    if info.get("auth_required") or connections.nats_allow_open:
        return
    raise OpenBrokerRefused(
        f"{name}: the NATS server at {_netloc(nc)} accepts connections without credentials, so any client could "
        "read every tenant's results and publish work as anyone. Configure its authorization (README: NATS "
        "authorization; `lpx nats config` prints the accounts block) and give this service its user "
        "(LPX_NATS_USER, LPX_NATS_PASSWORD), or set LPX_NATS_ALLOW_OPEN=true to run on an open broker knowingly."
    )


def _connect_failure(exc: BaseException) -> bool:
    return isinstance(exc, nats_errors.NoServersError | nats_errors.TimeoutError | OSError | asyncio.TimeoutError)


def _netloc(nc) -> str:
    url = getattr(nc, "connected_url", None)
    return url.netloc if url is not None else "?"
