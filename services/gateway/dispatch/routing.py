"""Routing: which worker of a pool takes a request.

`libs.routing.BoundedLoadRouter` (adapter affinity under a bounded load) per pool, or one of the
baseline policies the fleet benchmark compares it with, over the load signal: the pool's (workers'
heartbeats + this gateway's requests since) or this gateway's own in-flight counts."""

from __future__ import annotations

from dataclasses import dataclass, field

from libs.routing import BoundedLoadRouter, RouteDecision, make_policy
from services.gateway.dispatch.ledger import InFlight
from services.gateway.dispatch.settings import RoutingSettings
from services.gateway.pool_view import PoolView


@dataclass
class _LoadView:
    """What the baseline policies (random, least_loaded, consistent_hash) observe: the workers' loads."""

    loads: dict[str, int]
    adapter_loads: dict[str, int] = field(default_factory=dict)
    max_active_adapters: int = 0
    max_running: int = 0

    @property
    def total_load(self) -> int:
        return sum(self.loads.values())

    def queued(self, worker: str) -> int:
        return 0

    def running(self, worker: str) -> int:
        return self.loads.get(worker, 0)


class Routing:
    def __init__(self, settings: RoutingSettings, pools: PoolView, ledger: InFlight) -> None:
        self.policy = settings.policy
        self.load_signal = settings.load_signal
        self.pools = pools
        self.ledger = ledger
        self._router_args = dict(
            c=settings.balance_factor, hot_threshold=settings.hot_threshold, max_spread=settings.max_spread
        )
        self._routers: dict[str, tuple[tuple[str, ...], BoundedLoadRouter]] = {}
        self._policies: dict[tuple[str, str], tuple[tuple[str, ...], object]] = {}

    def router_for(self, pool: str, workers: tuple[str, ...]) -> BoundedLoadRouter:
        known = self._routers.get(pool)
        if known is None:
            router = BoundedLoadRouter(**self._router_args, workers=workers)
            self._routers[pool] = (workers, router)
            return router
        if known[0] != workers:
            known[1].set_workers(workers)
            self._routers[pool] = (workers, known[1])
        return known[1]

    def route(self, pool: str, workers: tuple[str, ...], token: str) -> RouteDecision:
        loads = self.worker_loads(workers)
        if self.policy != "bounded_load":
            return self._route_baseline(pool, workers, token, loads)
        return self.router_for(pool, workers).route(token, loads, self.ledger.adapter_loads[pool])

    def _route_baseline(self, pool: str, workers: tuple[str, ...], token: str, loads) -> RouteDecision:
        key = (pool, self.policy)
        known = self._policies.get(key)
        if known is None or known[0] != workers:
            known = (workers, make_policy(self.policy, workers, seed=0))
            self._policies[key] = known
        worker = known[1].choose(token, _LoadView(loads))
        return RouteDecision(worker, affinity_hit=False, spilled=False, candidates_tried=1)

    def worker_loads(self, workers: tuple[str, ...]) -> dict[str, int]:
        """The load each worker is routed by: the pool's (heartbeats + own deltas) or this gateway's."""
        if self.load_signal == "local":
            return self.ledger.loads
        return self.ledger.fleet.loads(workers, getattr(self.pools, "live", {}), self.ledger.loads)

    def spill_if_full(self, workers: tuple[str, ...], decision: RouteDecision) -> RouteDecision:
        """An interactive request whose affinity worker has every sequence busy goes to the least busy
        worker of the pool with one free, rather than queue behind that worker's work (its adapter
        loads there: a short cost next to waiting for a sequence)."""
        live = getattr(self.pools, "live", {})
        loads = self.worker_loads(workers)

        def busy(worker: str) -> float:
            capacity = live[worker].capacity if worker in live else 0
            return loads.get(worker, 0) / capacity if capacity > 0 else float("inf")

        if busy(decision.worker) < 1.0:
            return decision
        free = [w for w in workers if busy(w) < 1.0]
        if not free:
            return decision
        return RouteDecision(
            min(free, key=busy), affinity_hit=False, spilled=True, candidates_tried=decision.candidates_tried + 1
        )

    def pool_room(self, pool: str) -> tuple[int, int]:
        """(load, capacity) of a pool: in flight + queued on its live workers, and their summed capacity."""
        live = getattr(self.pools, "live", {})
        workers = tuple(w for w, beat in live.items() if beat.pool == pool)
        loads = self.worker_loads(workers)
        return sum(loads.get(w, 0) for w in workers), sum(live[w].capacity for w in workers)
