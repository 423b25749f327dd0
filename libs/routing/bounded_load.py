"""Consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam, SODA 2018), keyed by adapter id.

Rule, exactly as the gateway and the simulator apply it:

* Load is a worker's in-flight request count (routed and not yet finished: queued, loading or decoding).
* With m requests in flight over n workers, the request being routed may go to a worker only if that
  worker's load after taking it stays within ``ceil(c * (m + 1) / n)``. Walk the ring clockwise from
  the adapter's position and take the first worker under the bound. Since the loads sum to m, some
  worker is always under the bound, so the walk always ends.
* Hot adapters spread: an adapter that already has ``a`` requests in flight may use its first
  ``k = min(max_spread, 1 + a // hot_threshold)`` ring successors that are under the bound, and the
  least loaded of those wins (ties go to the earlier one on the ring). A cold or lukewarm adapter
  (a < hot_threshold) has k = 1 and behaves as plain bounded-load hashing. Because the successors are
  the same every time, a hot adapter lives on a small, stable set of workers and still loads rarely.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from libs.routing.hashing import DEFAULT_VNODES, HashRing

DEFAULT_BALANCE_FACTOR = 1.25
# Spreading defaults chosen on the reference simulation (2,000 adapters, 40 replicas, 500 req/s): a narrower
# spread (threshold 16, at most 8 replicas) pins the hottest adapters' replicas at the bound, so tail
# adapters homed there spill constantly (~40% of requests) and touch many replicas; these values cut
# spills to ~1% and loads per 1,000 requests by about half, with peak/mean load still under c.
DEFAULT_HOT_THRESHOLD = 8
DEFAULT_MAX_SPREAD = 16
_EMPTY: Mapping[str, int] = {}


class NoWorkersError(LookupError):
    """Raised when a request must be routed but no worker is registered."""


@dataclass(frozen=True, slots=True)
class RouteDecision:
    worker: str
    # True when the adapter's primary (first worker on the ring) took the request.
    affinity_hit: bool
    # True when at least one worker met on the walk was skipped because it was at its bound.
    spilled: bool
    # How many workers the walk examined (1 = the primary was taken straight away).
    candidates_tried: int


def load_bound(total_load: int, workers: int, c: float) -> int:
    """Largest load a worker may have after taking the next request: ceil(c x average after assignment)."""
    if workers < 1:
        raise NoWorkersError("no workers")
    # The epsilon keeps float noise (e.g. 60.000000001) from loosening the bound by one.
    return max(1, math.ceil(c * (total_load + 1) / workers - 1e-9))


class BoundedLoadRouter:
    """Pure routing logic: no I/O, no clocks, no randomness. Feed it the loads you observe."""

    def __init__(
        self,
        c: float = DEFAULT_BALANCE_FACTOR,
        vnodes: int = DEFAULT_VNODES,
        hot_threshold: int = DEFAULT_HOT_THRESHOLD,
        max_spread: int = DEFAULT_MAX_SPREAD,
        workers: Iterable[str] = (),
    ) -> None:
        if c <= 1.0:
            raise ValueError("the balance factor c must be > 1 (c = 1 would force perfect balance)")
        if hot_threshold < 1 or max_spread < 1:
            raise ValueError("hot_threshold and max_spread must be >= 1")
        self.c = c
        self.hot_threshold = hot_threshold
        self.max_spread = max_spread
        self.ring = HashRing(workers, vnodes=vnodes)

    @property
    def workers(self) -> tuple[str, ...]:
        return self.ring.workers

    def set_workers(self, ids: Iterable[str]) -> None:
        self.ring.set_workers(ids)

    def primary(self, adapter_id: str) -> str:
        """The worker an adapter lands on when nobody is overloaded."""
        self._require_workers()
        return self.ring.primary(adapter_id)

    def successors(self, adapter_id: str, k: int | None = None) -> tuple[str, ...]:
        """The adapter's ring order (primary first); the first `k` if given."""
        self._require_workers()
        order = self.ring.preference_list(adapter_id)
        return order if k is None else order[:k]

    def bound(self, total_load: int) -> int:
        return load_bound(total_load, len(self.ring), self.c)

    def spread_width(self, adapter_in_flight: int) -> int:
        """How many eligible successors a request of this adapter may choose among."""
        return min(self.max_spread, len(self.ring), 1 + adapter_in_flight // self.hot_threshold)

    def route(
        self,
        adapter_id: str,
        loads: Mapping[str, int],
        adapter_loads: Mapping[str, int] | None = None,
        total_load: int | None = None,
    ) -> RouteDecision:
        """Pick the worker for one request of `adapter_id`.

        loads: in-flight requests per worker (missing workers count as 0; unknown ids are ignored).
        adapter_loads: in-flight requests per adapter across the cluster (enables hot spreading).
        total_load: sum of `loads` over the current workers, if the caller maintains it incrementally.
        """
        self._require_workers()
        order = self.ring.preference_list(adapter_id)
        if total_load is None:
            total_load = sum(loads.get(w, 0) for w in order)
        cap = load_bound(total_load, len(order), self.c)
        width = self.spread_width((adapter_loads or _EMPTY).get(adapter_id, 0))
        eligible: list[str] = []
        tried = 0
        for worker in order:
            tried += 1
            if loads.get(worker, 0) < cap:
                eligible.append(worker)
                if len(eligible) == width:
                    break
        if not eligible:
            # Only reachable when `total_load` disagrees with `loads`; stay available, pick the least loaded.
            chosen = min(order, key=lambda w: loads.get(w, 0))
            return RouteDecision(chosen, chosen == order[0], True, tried)
        chosen = eligible[0] if width == 1 else min(eligible, key=lambda w: loads.get(w, 0))
        return RouteDecision(chosen, chosen == order[0], tried > len(eligible), tried)

    def _require_workers(self) -> None:
        if not len(self.ring):
            raise NoWorkersError("no workers registered with the router")
