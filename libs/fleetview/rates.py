"""What rates need between samples: recent heartbeats per worker, and the gateways' limit reports."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from libs.contracts import LimitReport, WorkerHeartbeat
from libs.fleetview.snapshot import BeatPair, TenantWindow


class BeatHistory:
    """Each worker's distinct heartbeats of the last `history_s` seconds. A rate is taken between the
    oldest and the newest of them (smoother than the last two), only within one worker process: a
    restarted worker (another `instance`) starts its counters from zero."""

    def __init__(self, history_s: float = 10.0) -> None:
        self.history_s = history_s
        self._beats: dict[str, list[WorkerHeartbeat]] = {}

    def add(self, beats: Mapping[str, WorkerHeartbeat]) -> None:
        """The beats read now; workers missing from them have left (drained or expired)."""
        self._beats = {worker: self._kept(self._beats.get(worker, []), beat) for worker, beat in beats.items()}

    def _kept(self, seen: list[WorkerHeartbeat], beat: WorkerHeartbeat) -> list[WorkerHeartbeat]:
        earlier = [b for b in seen if b.instance == beat.instance and b.ts < beat.ts]
        # With nothing earlier inside the window, the newest beat before it still gives a rate (a worker
        # beating less often than every `history_s`).
        recent = [b for b in earlier if beat.ts - b.ts <= self.history_s] or earlier[-1:]
        return recent + [beat]

    def pairs(self) -> dict[str, BeatPair]:
        return {
            worker: BeatPair(beats[-1], beats[0] if len(beats) > 1 else None) for worker, beats in self._beats.items()
        }

    def newest(self) -> dict[str, WorkerHeartbeat]:
        return {worker: beats[-1] for worker, beats in self._beats.items()}


class TenantTally:
    """The gateways' limit reports summed between two `take`s: each report says what one gateway
    admitted per tenant since its previous report, and how many of the tenant's requests it has in
    flight now. A gateway silent for `stale_s` (gone) no longer counts for in flight."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, stale_s: float = 3.0) -> None:
        self._clock = clock
        self.stale_s = stale_s
        self._since = clock()
        self._requests: dict[str, int] = {}
        self._in_flight: dict[tuple[str, str], int] = {}  # (gateway, tenant) -> in flight
        self._heard: dict[str, float] = {}  # gateway -> when it last reported

    def add(self, report: LimitReport) -> None:
        now = self._clock()
        self._heard[report.gateway_id] = now
        for tenant, delta in report.tenants.items():
            self._requests[tenant] = self._requests.get(tenant, 0) + delta.requests
            self._in_flight[(report.gateway_id, tenant)] = delta.in_flight

    def take(self) -> TenantWindow:
        """What was reported since the previous take (or since this tally started)."""
        now = self._clock()
        live = {gateway for gateway, at in self._heard.items() if now - at <= self.stale_s}
        in_flight: dict[str, int] = {}
        for (gateway, tenant), count in self._in_flight.items():
            if gateway in live and count:
                in_flight[tenant] = in_flight.get(tenant, 0) + count
        window = TenantWindow(now - self._since, dict(self._requests), in_flight, tuple(sorted(live)))
        self._since, self._requests = now, {}
        self._in_flight = {key: n for key, n in self._in_flight.items() if key[0] in live}
        self._heard = {gateway: at for gateway, at in self._heard.items() if gateway in live}
        return window
