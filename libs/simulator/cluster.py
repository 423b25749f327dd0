"""Replica state (engine slots, host-RAM cache, queues) and the cluster view that routers observe."""

from __future__ import annotations

import random
from collections import OrderedDict, deque
from collections.abc import Collection, Iterable


class Replica:
    """One worker: a vLLM engine with `slots` LoRA slots (LRU) and a host-RAM adapter cache (LRU).

    queue: requests whose adapter is on the host, waiting for a batch seat (FIFO).
    fetching: adapter -> requests waiting for its fetch into host RAM (from disk or the object store).
    disk: the local disk tier (LRU), when the configuration models one.
    active: adapter -> requests of it in the running batch; those adapters are pinned in their slots.
    waiting: adapter -> requests of it not yet running (queued or fetching).
    """

    __slots__ = ("name", "index", "queue", "fetching", "running", "slots", "host", "disk", "active", "waiting")

    def __init__(self, name: str, index: int) -> None:
        self.name = name
        self.index = index
        self.queue: deque[int] = deque()
        self.fetching: dict[str, list[int]] = {}
        self.running = 0
        self.slots: OrderedDict[str, None] = OrderedDict()
        self.host: OrderedDict[str, None] = OrderedDict()
        self.disk: OrderedDict[str, None] = OrderedDict()  # with SimConfig.disk_cache_adapters
        self.active: dict[str, int] = {}
        self.waiting: dict[str, int] = {}


def replica_names(count: int) -> list[str]:
    width = max(2, len(str(count - 1)))
    return [f"worker-{i:0{width}d}" for i in range(count)]


class ClusterState:
    """Implements libs.routing.ClusterView over the simulated replicas."""

    def __init__(self, names: Iterable[str], max_active_adapters: int, max_running: int) -> None:
        self.replicas: dict[str, Replica] = {name: Replica(name, i) for i, name in enumerate(names)}
        self.loads: dict[str, int] = dict.fromkeys(self.replicas, 0)
        self.total_load = 0
        self.adapter_loads: dict[str, int] = {}
        self.holders: dict[str, set[str]] = {}  # adapter -> replicas with it in an engine slot
        self.max_active_adapters = max_active_adapters
        self.max_running = max_running

    def queued(self, worker: str) -> int:
        return self.loads[worker] - self.replicas[worker].running

    def running(self, worker: str) -> int:
        return self.replicas[worker].running

    def running_adapters(self, worker: str) -> Collection[str]:
        return self.replicas[worker].active.keys()

    def waiting_adapters(self, worker: str) -> Collection[str]:
        return self.replicas[worker].waiting.keys()

    def resident_adapters(self, worker: str) -> Collection[str]:
        return self.replicas[worker].slots.keys()

    def workers_with_adapter(self, adapter_id: str) -> Collection[str]:
        return self.holders.get(adapter_id, ())

    def pass_on(self, rng: random.Random, bound: int, away_from: str) -> str:
        """Who takes a request a worker passed on: whoever pulls the pool's shared subject within the
        bound, at random (the least loaded when nobody is under it)."""
        under = [w for w, load in self.loads.items() if load < bound and w != away_from]
        return rng.choice(under) if under else min(self.loads, key=self.loads.__getitem__)

    def max_over_mean(self) -> float:
        """Peak-to-mean in-flight load right now (1.0 when idle)."""
        if not self.total_load:
            return 1.0
        return max(self.loads.values()) * len(self.loads) / self.total_load
