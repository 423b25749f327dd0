"""The pool's load bound, held by the worker itself: work routed here above the bound goes on.

The gateways route with bounded-load consistent hashing (`libs.routing`): a worker may take the next
request only while its load after taking it stays within ceil(c * (m + 1) / n), m being the pool's
requests in flight over n live workers. Each gateway sees the others' choices a few milliseconds late
(WorkerLoad messages), so two gateways choosing in the same instant can both see room on one worker and
overfill it (the fleet benchmark found 4% of assignments over the bound with 3 gateways).

The worker is the one place that knows its own load exactly, so it checks the bound again as it takes
each message: its exact in-flight count against the bound over the pool's loads (its own count plus the
others' latest WorkerLoad).

* From its own subject, a message over the bound is published to the pool's shared subject and only then
  acknowledged: nothing is lost if this worker dies in between, and the copy carries a Nats-Msg-Id
  derived from the original one, so a redelivered original passed on again is stored once.
* From the shared subject, a worker pulls only as many as keep it within the bound, so whoever takes a
  passed-on message is under it. One that still arrives over the bound (the pull waited while the
  own subject filled the worker) is handed back to the shared consumer with a short delay; after
  `MAX_RETURNS` returns it is kept (no request waits for ever on a full pool).

The shared subject, not the next worker on the ring: its durable consumer belongs to the pool, so a
worker that dies with a passed-on message unstarted strands nothing (a dead worker's own subject is
purged by the gateways, which re-route only what they routed there). The price: a passed-on request
loses its adapter affinity (one adapter load on the worker that takes it). Results go to the request's
reply subject from whichever worker ran it, so the gateway needs no word of the move.

Chosen over a shared counter in NATS KV (compare-and-set per request): that puts two replicated writes
and a retry loop on every request's path; this costs nothing while loads are under the bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from opentelemetry import metrics
from pydantic import ValidationError

from libs.contracts import WorkerLoad, subjects
from libs.routing import load_bound

log = logging.getLogger(__name__)
# Returns of a pool message taken over the bound before it is kept anyway: at 0.1 s each, a request
# waits at most about a second for a worker under the bound.
MAX_RETURNS = 10
RETURN_DELAY_S = 0.1


class PoolLoads:
    """What this worker knows of its pool: each worker's latest WorkerLoad (every worker publishes one on
    every change and at least every few seconds). The members are the workers heard from within
    `staleness_s`, the gateways' heartbeat staleness: both sides count the same workers within seconds.
    No KV reads: with dozens of workers, polling the heartbeat bucket would cost thousands of requests
    a second on the broker."""

    def __init__(self, me: str, staleness_s: float = 10.0, clock=time.time) -> None:
        self.me = me
        self.staleness_s = staleness_s
        self._clock = clock
        self._loads: dict[str, tuple[int, float]] = {}  # worker -> (in_flight, ts)

    @property
    def members(self) -> tuple[str, ...]:
        now = self._clock()
        fresh = {w for w, (_, ts) in self._loads.items() if now - ts <= self.staleness_s}
        return tuple(sorted(fresh | {self.me}))

    def reported(self, worker: str, in_flight: int, ts: float) -> None:
        known = self._loads.get(worker)
        if known is None or ts >= known[1]:
            self._loads[worker] = (in_flight, ts)

    def load(self, worker: str) -> int:
        return self._loads.get(worker, (0, 0.0))[0]


class LoadBound:
    """Decides, per message taken, whether this worker keeps it (services/worker/app.py acts on it)."""

    def __init__(self, me: str, c: float, meter: metrics.Meter | None = None, staleness_s: float = 10.0) -> None:
        self.me = me
        self.c = c
        self.pool = PoolLoads(me, staleness_s)
        self.handed_on = 0  # counted for the heartbeat (`lpx top`, the fleet benchmark)
        self.kept_over = 0  # taken over the bound after MAX_RETURNS returns
        meter = meter or metrics.get_meter("loraplex.worker")
        self._handoffs = meter.create_counter(
            "lpx_worker_bound_handoffs", description="messages passed to the pool: over the pool's load bound"
        )
        self._returned = meter.create_counter(
            "lpx_worker_bound_returned", description="pool messages handed back: taken while over the bound"
        )
        self._kept_over = meter.create_counter(
            "lpx_worker_bound_kept_over", description="messages kept over the load bound (returned too often)"
        )
        self.handoff_seconds = meter.create_histogram(
            "lpx_worker_bound_handoff_seconds", unit="s", description="time to pass a message on (publish + ack)"
        )

    def bound(self, own_in_flight: int) -> int:
        members = self.pool.members
        others = sum(self.pool.load(w) for w in members if w != self.me)
        return load_bound(own_in_flight + others, len(members), self.c)

    def over(self, own_in_flight: int) -> bool:
        """Would taking one more put this worker over the pool's bound?"""
        return own_in_flight + 1 > self.bound(own_in_flight)

    def room(self, own_in_flight: int, most: int) -> int:
        """How many more this worker may take (at most `most`) and stay within the bound."""
        taken = 0
        while taken < most and not self.over(own_in_flight + taken):
            taken += 1
        return taken

    async def wait_for_room(self, own_in_flight, most: int, poll_s: float = 0.05) -> int:
        """Wait until the bound leaves room for one more (the others' loads change as they report)."""
        while (free := self.room(own_in_flight(), most)) < 1:
            await asyncio.sleep(poll_s)
        return free

    def keep_returned(self, deliveries: int) -> bool:
        """A pool message taken over the bound: keep it only once it has come back too often."""
        if deliveries > MAX_RETURNS:
            self.kept_over += 1
            self._kept_over.add(1)
            return True
        self._returned.add(1)
        return False

    def passed_on(self, seconds: float) -> None:
        self.handed_on += 1
        self._handoffs.add(1)
        self.handoff_seconds.record(seconds)

    async def on_load(self, msg) -> None:
        """A WorkerLoad from a worker of this pool (core NATS)."""
        with contextlib.suppress(ValidationError):
            load = WorkerLoad.model_validate_json(msg.data)
            if load.worker_id != self.me:
                self.pool.reported(load.worker_id, load.in_flight, load.ts)


def passed_on_headers(msg, me: str) -> dict[str, str]:
    """The original headers (trace context included) with a Nats-Msg-Id of its own: a redelivered
    original passed on again is stored once (JetStream's duplicate window)."""
    headers = dict(msg.headers or {})
    headers["Nats-Msg-Id"] = f"{headers.get('Nats-Msg-Id', msg.reply)}-bound-{me}"
    return headers


def pool_subject(pool: str, msg) -> str:
    """The pool's shared subject, for the same adapter token."""
    return subjects.infer_any(pool, msg.subject.rsplit(".", 1)[-1])
