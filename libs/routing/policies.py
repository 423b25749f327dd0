"""Routing policies behind one interface, so the simulator can compare them and the gateway can pick one.

Every policy reads the cluster through `ClusterView` (what a gateway can know from worker heartbeats and
its own bookkeeping) and returns a worker id. Randomised policies take a seeded `random.Random`, so a
simulation is reproducible.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from libs.routing.bounded_load import (
    DEFAULT_BALANCE_FACTOR,
    DEFAULT_HOT_THRESHOLD,
    DEFAULT_MAX_SPREAD,
    BoundedLoadRouter,
    NoWorkersError,
)
from libs.routing.hashing import DEFAULT_VNODES, HashRing


class ClusterView(Protocol):
    """What a router may observe. Loads are in-flight requests (queued + loading + running)."""

    loads: Mapping[str, int]
    total_load: int
    adapter_loads: Mapping[str, int]  # in-flight requests per adapter, cluster-wide
    max_active_adapters: int  # engine LoRA slots per worker (vLLM max_loras)
    max_running: int  # concurrent sequences per worker (vLLM max_num_seqs)

    def queued(self, worker: str) -> int: ...

    def running(self, worker: str) -> int: ...

    def running_adapters(self, worker: str) -> Collection[str]: ...

    def waiting_adapters(self, worker: str) -> Collection[str]: ...

    def resident_adapters(self, worker: str) -> Collection[str]: ...

    def workers_with_adapter(self, adapter_id: str) -> Collection[str]: ...


class RoutingPolicy(Protocol):
    name: str

    def set_workers(self, ids: Sequence[str]) -> None: ...

    def choose(self, adapter_id: str, view: ClusterView) -> str: ...


class _WorkerList:
    """Shared membership handling for the policies that do not hash."""

    def __init__(self) -> None:
        self.workers: tuple[str, ...] = ()

    def set_workers(self, ids: Sequence[str]) -> None:
        self.workers = tuple(sorted(set(ids)))

    def _require(self) -> tuple[str, ...]:
        if not self.workers:
            raise NoWorkersError("no workers registered")
        return self.workers


class RandomPolicy(_WorkerList):
    """Uniformly random worker: the no-affinity baseline."""

    name = "random"

    def __init__(self, rng: random.Random) -> None:
        super().__init__()
        self.rng = rng

    def choose(self, adapter_id: str, view: ClusterView) -> str:
        workers = self._require()
        return workers[self.rng.randrange(len(workers))]


class LeastLoadedPolicy(_WorkerList):
    """Fewest in-flight requests; ties broken at random so low load does not pile onto one worker."""

    name = "least_loaded"

    def __init__(self, rng: random.Random) -> None:
        super().__init__()
        self.rng = rng

    def choose(self, adapter_id: str, view: ClusterView) -> str:
        workers = self._require()
        loads = view.loads
        offset = self.rng.randrange(len(workers))
        rotated = workers[offset:] + workers[:offset]
        return min(rotated, key=lambda w: loads.get(w, 0))


class ConsistentHashPolicy:
    """Plain consistent hashing on the adapter id: always the primary, whatever its load."""

    name = "consistent_hash"

    def __init__(self, vnodes: int = DEFAULT_VNODES) -> None:
        self.ring = HashRing(vnodes=vnodes)

    def set_workers(self, ids: Sequence[str]) -> None:
        self.ring.set_workers(ids)

    def choose(self, adapter_id: str, view: ClusterView) -> str:
        if not len(self.ring):
            raise NoWorkersError("no workers registered")
        return self.ring.primary(adapter_id)


@dataclass
class RoutingStats:
    routed: int = 0
    affinity_hits: int = 0
    spills: int = 0
    walk_lengths: list[int] = field(default_factory=list, repr=False)


class BoundedLoadPolicy:
    """loraplex's router (libs.routing.bounded_load) behind the policy interface, counting its decisions."""

    name = "bounded_load"

    def __init__(
        self,
        c: float = DEFAULT_BALANCE_FACTOR,
        vnodes: int = DEFAULT_VNODES,
        hot_threshold: int = DEFAULT_HOT_THRESHOLD,
        max_spread: int = DEFAULT_MAX_SPREAD,
    ) -> None:
        self.router = BoundedLoadRouter(c=c, vnodes=vnodes, hot_threshold=hot_threshold, max_spread=max_spread)
        self.stats = RoutingStats()

    def set_workers(self, ids: Sequence[str]) -> None:
        self.router.set_workers(ids)

    def choose(self, adapter_id: str, view: ClusterView) -> str:
        decision = self.router.route(adapter_id, view.loads, view.adapter_loads, view.total_load)
        stats = self.stats
        stats.routed += 1
        stats.affinity_hits += decision.affinity_hit
        stats.spills += decision.spilled
        return decision.worker


class GieLoraAffinityPolicy(_WorkerList):
    """Kubernetes Gateway API Inference Extension (GIE) endpoint picker, scorer profile, for LoRA traffic.

    Modelled on kubernetes-sigs/gateway-api-inference-extension:
      * pkg/epp/scheduling/framework/plugins/scorer/lora_affinity.go (also .../loraaffinityscorer/):
        1.0 if the adapter is active on the pod (vLLM `running_lora_adapters`), else 0.8 if
        len(active) + len(waiting) < max_loras, else 0.6 if it is waiting there, else 0.0;
      * .../scorer/queue.go: (maxQueue - queue) / (maxQueue - minQueue) over the candidates, 1.0 if all equal;
      * .../scorer/kvcache_utilization.go: 1 - KV-cache utilisation;
      * .../picker/max_score_picker.go: highest weighted sum wins, ties broken at random;
      * the config loader's DefaultScorerWeight = 1 for scorers listed without a weight.
    Simplified: the simulator has no KV-cache model, so KV utilisation is approximated by
    running / max_running; metrics are read fresh for every request (the real EPP scrapes them about
    every 50 ms, which is staler); the prefix-cache scorer is left out (no prompts in the simulation);
    no saturation-based shedding.
    """

    name = "gie_lora_affinity"

    def __init__(
        self, rng: random.Random, queue_weight: float = 1.0, kv_weight: float = 1.0, lora_weight: float = 1.0
    ) -> None:
        super().__init__()
        self.rng = rng
        self.weights = (queue_weight, kv_weight, lora_weight)

    def lora_score(self, adapter_id: str, worker: str, view: ClusterView) -> float:
        active = view.running_adapters(worker)
        waiting = view.waiting_adapters(worker)
        if adapter_id in active:
            return 1.0
        if len(active) + len(waiting) < view.max_active_adapters:
            return 0.8
        if adapter_id in waiting:
            return 0.6
        return 0.0

    def choose(self, adapter_id: str, view: ClusterView) -> str:
        workers = self._require()
        queues = [view.queued(w) for w in workers]
        low, high = min(queues), max(queues)
        spread = high - low
        w_queue, w_kv, w_lora = self.weights
        best_score = -1.0
        best: list[str] = []
        for worker, queue in zip(workers, queues, strict=True):
            queue_score = 1.0 if spread == 0 else (high - queue) / spread
            kv_score = 1.0 - min(1.0, view.running(worker) / view.max_running)
            score = w_queue * queue_score + w_kv * kv_score + w_lora * self.lora_score(adapter_id, worker, view)
            if score > best_score + 1e-12:
                best_score, best = score, [worker]
            elif score > best_score - 1e-12:
                best.append(worker)
        return best[self.rng.randrange(len(best))]


class RayMultiplexPolicy(_WorkerList):
    """Ray Serve model multiplexing (`serve.multiplexed`, request header multiplexed_model_id).

    Modelled on ray-project/ray python/ray/serve/_private/request_router/:
      * request_router.py, MultiplexMixin.apply_multiplex_routing: candidates are first the replicas that
        report the model id loaded; if none has it, the replicas with the fewest loaded models; after
        that, all replicas;
      * pow_2_router.py, PowerOfTwoChoicesRequestRouter.choose_replicas: two distinct random candidates,
        and of those that accept (queue length < max_ongoing_requests) the shorter queue wins.
    Simplified: Ray retries with backoff and a 1-2 s matching timeout before widening the candidate set;
    here the three candidate tiers are tried at once in that order, and if no sampled replica accepts
    anywhere the least-loaded replica takes the request (instead of waiting in the router).
    "Loaded models" are the adapters resident in the replica's engine LoRA slots.
    """

    name = "ray_multiplex"

    def __init__(self, rng: random.Random, max_ongoing_requests: int | None = None) -> None:
        super().__init__()
        self.rng = rng
        self.max_ongoing_requests = max_ongoing_requests

    def _fewest_models(self, view: ClusterView) -> list[str]:
        counts = {w: len(view.resident_adapters(w)) for w in self.workers}
        fewest = min(counts.values())
        return [w for w, n in counts.items() if n == fewest]

    def _power_of_two(self, candidates: Sequence[str], view: ClusterView, limit: int) -> str | None:
        n = len(candidates)
        if n == 1:
            sampled = [candidates[0]]
        else:
            i = self.rng.randrange(n)
            j = self.rng.randrange(n - 1)
            sampled = [candidates[i], candidates[j + (j >= i)]]
        accepting = [w for w in sampled if view.loads.get(w, 0) < limit]
        if not accepting:
            return None
        return min(accepting, key=lambda w: view.loads.get(w, 0))

    def choose(self, adapter_id: str, view: ClusterView) -> str:
        workers = self._require()
        limit = self.max_ongoing_requests or 2 * view.max_running
        tiers: list[Callable[[], Sequence[str]]] = [
            lambda: sorted(set(view.workers_with_adapter(adapter_id)).intersection(workers)),
            lambda: self._fewest_models(view),
            lambda: workers,
        ]
        for candidates_of in tiers:
            candidates = candidates_of()
            if candidates:
                chosen = self._power_of_two(candidates, view, limit)
                if chosen is not None:
                    return chosen
        return min(workers, key=lambda w: view.loads.get(w, 0))


POLICY_NAMES: tuple[str, ...] = (
    "random",
    "least_loaded",
    "consistent_hash",
    "bounded_load",
    "gie_lora_affinity",
    "ray_multiplex",
)


def make_policy(
    name: str,
    workers: Sequence[str],
    seed: int = 0,
    c: float = DEFAULT_BALANCE_FACTOR,
    vnodes: int = DEFAULT_VNODES,
    hot_threshold: int = DEFAULT_HOT_THRESHOLD,
    max_spread: int = DEFAULT_MAX_SPREAD,
) -> RoutingPolicy:
    """Build a policy by name, registered with `workers`; randomised policies get their own seeded RNG."""
    rng = random.Random(f"{name}:{seed}")
    factories: dict[str, Callable[[], RoutingPolicy]] = {
        "random": lambda: RandomPolicy(rng),
        "least_loaded": lambda: LeastLoadedPolicy(rng),
        "consistent_hash": lambda: ConsistentHashPolicy(vnodes=vnodes),
        "bounded_load": lambda: BoundedLoadPolicy(
            c=c, vnodes=vnodes, hot_threshold=hot_threshold, max_spread=max_spread
        ),
        "gie_lora_affinity": lambda: GieLoraAffinityPolicy(rng),
        "ray_multiplex": lambda: RayMultiplexPolicy(rng),
    }
    try:
        policy = factories[name]()
    except KeyError:
        raise ValueError(f"unknown routing policy {name!r}; known: {', '.join(POLICY_NAMES)}") from None
    policy.set_workers(workers)
    return policy
