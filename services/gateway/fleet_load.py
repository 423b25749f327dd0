"""Each worker's load as the whole pool sees it, for bounded-load routing across gateway replicas.

A gateway alone knows only its own in-flight requests; with N replicas behind a load balancer the
bounded-load guarantee would then hold per gateway, not for the pool. The workers' heartbeats carry
their real load (requests in flight plus those routed to them and not yet taken, from every gateway),
but only as of the heartbeat. So a worker's load here is:

    heartbeat.in_flight + heartbeat.queued  (everyone's work, at heartbeat time ts)
    + this gateway's requests sent to it after ts - this gateway's requests it answered after ts

and never less than what this gateway alone has in flight there. Workers also publish their in-flight
count on every change (WorkerLoad, core NATS): when that is fresher than the heartbeat it is the base
instead (`queued` is then left out: what is routed and not yet taken is milliseconds of transit). The
error is what other gateways sent in the last few milliseconds (or since the last heartbeat if the
load messages are lost: they are not stored). `ts` is the worker's clock: on one host exact, across
hosts it carries their skew (keep clocks in sync, as for every timeout here).

Chosen over a shared counter in NATS KV: a KV update per request and per answer would put two
replicated writes on every request's path; the heartbeat costs nothing extra.
"""

from __future__ import annotations

import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Mapping

from libs.contracts import WorkerHeartbeat


class FleetLoad:
    def __init__(self, horizon_s: float = 60.0, clock: Callable[[], float] = time.time) -> None:
        self.horizon_s = horizon_s
        self._clock = clock
        self._events: dict[str, deque[tuple[float, int]]] = defaultdict(deque)
        self._reported: dict[str, tuple[int, float]] = {}  # worker -> (in_flight, ts) of its last WorkerLoad

    def reported(self, worker: str, in_flight: int, ts: float) -> None:
        """A WorkerLoad message: the worker's own count at `ts` (older ones arriving late are ignored)."""
        known = self._reported.get(worker)
        if known is None or ts >= known[1]:
            self._reported[worker] = (in_flight, ts)

    def sent(self, worker: str) -> None:
        self._record(worker, +1)

    def answered(self, worker: str, at: float | None = None) -> None:
        """One of this gateway's requests on `worker` ended. `at`: when the worker stopped counting it (the
        result's `load_left_at`, the time of the WorkerLoad that left it out, on the worker's clock), so
        that report and later ones are never lowered by it a second time; none: now."""
        self._record(worker, -1, at)

    def _record(self, worker: str, delta: int, at: float | None = None) -> None:
        now = self._clock()
        events = self._events[worker]
        _insert_in_time_order(events, (now if at is None else min(at, now), delta))
        while events and now - events[0][0] > self.horizon_s:
            events.popleft()

    def since(self, worker: str, ts: float) -> int:
        """This gateway's net change of `worker`'s load after `ts`: only the events after `ts` are read
        (they are kept in time order), not the horizon's (at 100 requests/s a worker, 12,000 a call)."""
        total = 0
        for at, delta in reversed(self._events.get(worker, ())):
            if at <= ts:
                break
            total += delta
        return total

    def loads(
        self, workers: Iterable[str], beats: Mapping[str, WorkerHeartbeat], local: Mapping[str, int]
    ) -> dict[str, int]:
        out = {}
        for worker in workers:
            own = local.get(worker, 0)
            beat, reported = beats.get(worker), self._reported.get(worker)
            if reported is not None and (beat is None or reported[1] > beat.ts):
                base, ts = reported
            elif beat is not None:
                base, ts = beat.in_flight + beat.queued, beat.ts
            else:
                out[worker] = own
                continue
            out[worker] = max(own, base + self.since(worker, ts), 0)
        return out


def _insert_in_time_order(events: deque[tuple[float, int]], event: tuple[float, int]) -> None:
    """Append, or (an answer stamped at the worker's earlier `load_left_at`) insert before the later
    events: those are the last few, so the walk back is short."""
    index = len(events)
    while index and events[index - 1][0] > event[0]:
        index -= 1
    events.insert(index, event)
