"""The discrete-event loop: arrivals, object-store fetches, engine admission, completions.

Life of a request on its replica (chosen by the routing policy at arrival):
  1. adapter in an engine slot or in host RAM -> engine queue; otherwise an object-store fetch into host
     RAM (requests for an adapter already being fetched wait for that fetch; no second fetch);
  2. the engine admits queued requests FIFO while it has a batch seat (max_running). An adapter not in a
     slot takes the least recently used unpinned slot and is copied host -> GPU (adapter bytes / bandwidth).
     Adapters with running requests are pinned. If every slot is pinned, requests whose adapter is
     resident may overtake the blocked head (as vLLM's scheduler skips requests it cannot batch);
  3. decoding takes output_tokens / per-sequence speed, stretched by the batch's adapter mix.
Load is in-flight requests per replica (steps 1-3), counted when the router assigns the request.
Placement and churn: `libs.simulator.placement`.

Simplified: a host -> GPU copy delays only its own request (vLLM stalls the whole step for ~3 ms);
service time is fixed at admission; there is no prefill phase and no KV-cache pressure.
"""

from __future__ import annotations

import heapq
import math
import random
from bisect import bisect_left
from dataclasses import dataclass, field

from libs.routing import load_bound, make_policy
from libs.simulator.cluster import ClusterState, Replica, replica_names
from libs.simulator.config import SimConfig
from libs.simulator.placement import PlacementEvents
from libs.simulator.traffic import Traffic, adapter_name

TIER_GPU, TIER_HOST, TIER_COLD = 0, 1, 2
_COMPLETE, _FETCHED = 0, 1
_SKIP_AHEAD_WINDOW = 256


@dataclass(frozen=True)
class Scenario:
    name: str
    warmup_s: float
    window_s: float
    prewarm_top: int = 0  # fill every replica's host RAM and engine slots with the top-N adapters first
    placement: bool = False  # each replica pre-loads its ring share (see the module docstring)
    churn_every_s: float = 0.0  # with placement: a replica leaves and comes back empty at this period


@dataclass
class RunResult:
    """Raw outcome of one policy under one scenario; `libs.simulator.metrics` turns it into a report."""

    policy: str
    scenario: Scenario
    requests: int
    measured: int
    served_once: bool
    latency_s: list[float]
    wait_s: list[float]
    tiers: list[int]
    host_loads: int
    cold_loads: int
    bound_violations: int  # assignments above ceil(c x mean), over the whole run
    max_bound_use: float  # max over assignments of load / ceil(c x mean)
    load_ratios: list[float]  # per measured assignment: chosen replica's load / mean load
    sampled_max_over_mean: list[float]
    cold_loads_per_s: list[int]
    replica_of: list[int]
    adapter_rank: list[int]
    routing_stats: dict = field(default_factory=dict)
    placement_fetches: int = 0  # adapters fetched by placement (not by a request), over the whole run
    object_fetches: int = 0  # measured cold loads from the object store (the others came from local disk)
    wall_s: float = 0.0


class Simulation(PlacementEvents):
    """One policy, one scenario. Per-request state lives in flat lists indexed by request number."""

    def __init__(self, config: SimConfig, policy_name: str, traffic: Traffic, scenario: Scenario) -> None:
        self.config = config
        self.policy_name = policy_name
        self.scenario = scenario
        horizon = scenario.warmup_s + scenario.window_s
        count = bisect_left(traffic.arrival_s, horizon)
        self.arrival_s = traffic.arrival_s[:count]
        self.ranks = traffic.adapter_rank[:count]
        names = replica_names(config.replicas)
        self.cluster = ClusterState(names, config.engine_slots, config.max_running)
        self.replica_list = list(self.cluster.replicas.values())
        self.policy = make_policy(
            policy_name,
            names,
            seed=config.seed,
            c=config.balance_factor,
            vnodes=config.vnodes,
            hot_threshold=config.hot_threshold,
            max_spread=config.max_spread,
        )
        self.fetch_rng = random.Random(f"fetch:{config.seed}:{policy_name}:{scenario.name}")
        self.handoffs_rng = random.Random(f"handoff:{config.seed}:{policy_name}:{scenario.name}")
        self.handoffs = 0
        self.adapter_ids = [adapter_name(r) for r in range(config.adapters)]
        # Service model constants.
        self.copy_s = config.copy_s
        self.base_service_s = config.output_tokens / config.per_sequence_tok_s
        self.mix_scale = config.mixed_adapter_overhead / max(1, config.max_running - 1)
        self.full_mix = 1.0 + config.mixed_adapter_overhead
        # Per-request state.
        self.start_measure = scenario.warmup_s
        self.end_measure = scenario.warmup_s + scenario.window_s
        self.measured = [self.start_measure <= t < self.end_measure for t in self.arrival_s]
        self.replica_of = [-1] * count
        self.tier = [TIER_GPU] * count
        self.begin_s = [0.0] * count
        self.finish_s = [0.0] * count
        self.served = [0] * count
        # Counters and samples.
        self.host_loads = 0
        self.cold_loads = 0
        self.violations = 0
        self.max_bound_use = 0.0
        self.load_ratios: list[float] = []
        self.cold_per_s = [0] * max(1, math.ceil(self.end_measure))
        self.samples: list[float] = []
        self.next_sample = self.start_measure
        self.heap: list[tuple] = []
        self.seq = 0
        if scenario.prewarm_top:
            self._prewarm(scenario.prewarm_top)
        self.object_fetches = 0
        self._start_placement(names)

    def _prewarm(self, top: int) -> None:
        hot = self.adapter_ids[:top]
        for replica in self.replica_list:
            for adapter in hot[: self.config.host_capacity]:
                replica.host[adapter] = None
            for adapter in hot[: self.config.engine_slots]:
                replica.slots[adapter] = None
                self.cluster.holders.setdefault(adapter, set()).add(replica.name)

    def _push(self, at: float, kind: int, first: object, second: object = None) -> None:
        self.seq += 1  # the sequence number keeps equal-time events in insertion order
        heapq.heappush(self.heap, (at, self.seq, kind, first, second))

    def run(self) -> RunResult:
        arrival_s, heap, pop = self.arrival_s, self.heap, heapq.heappop
        n = len(arrival_s)
        i = 0
        while i < n or heap:
            if i < n and (not heap or arrival_s[i] <= heap[0][0]):
                self._on_arrival(i, arrival_s[i])
                i += 1
                continue
            now, _, kind, first, second = pop(heap)
            if kind == _COMPLETE:
                self._on_complete(first, now)
            elif kind == _FETCHED:
                self._on_fetched(self.replica_list[first], second, now)
            else:
                self._on_placement_event(kind, first, second, now)
        return self._result()

    # Events -------------------------------------------------------------------------------------------

    def _on_arrival(self, req: int, now: float) -> None:
        if self.next_sample <= now < self.end_measure:
            self.samples.append(self.cluster.max_over_mean())
            self.next_sample += self.config.sample_interval_s
        adapter = self.adapter_ids[self.ranks[req]]
        self.demand[adapter] = self.demand.get(adapter, 0) + 1
        rep = self.cluster.replicas[self._taken_by(req, self.policy.choose(adapter, self.cluster))]
        self._assign(req, adapter, rep)
        if adapter in rep.slots or adapter in rep.host:
            if adapter in rep.host:
                rep.host.move_to_end(adapter)
            rep.queue.append(req)
            self._try_start(rep, now)
            return
        self.tier[req] = TIER_COLD
        waiters = rep.fetching.get(adapter)
        if waiters is not None:  # a fetch is already under way: wait for it, do not fetch twice
            waiters.append(req)
            return
        rep.fetching[adapter] = [req]
        from_disk = adapter in rep.disk
        if self.measured[req]:
            self.cold_loads += 1
            self.cold_per_s[int(now)] += 1
            self.object_fetches += not from_disk
        if from_disk:
            rep.disk.move_to_end(adapter)
            took = self.config.disk_load_s
        else:
            took = self.fetch_rng.uniform(self.config.fetch_s_min, self.config.fetch_s_max)
        self._push(now + took, _FETCHED, rep.index, adapter)

    def _taken_by(self, req: int, chosen: str) -> str:
        """The worker that runs request `req` the router gave `chosen`: `chosen`, unless the workers' hand-offs
        are below their share (SimConfig.handoff_share) and `req` fills `chosen` to the bound. The workers
        pass those on (two gateways choosing at once both see its last place free), to one under the bound."""
        cluster = self.cluster
        if self.handoffs >= self.config.handoff_share * (req + 1):
            return chosen
        bound = load_bound(cluster.total_load, len(self.replica_list), self.config.balance_factor)
        if cluster.loads[chosen] + 1 < bound:
            return chosen
        self.handoffs += 1
        return cluster.pass_on(self.handoffs_rng, bound, chosen)

    def _assign(self, req: int, adapter: str, rep: Replica) -> None:
        """Book the request on its replica, checking the load bound as it stood when the router chose."""
        cluster = self.cluster
        workers = len(self.replica_list)
        total = cluster.total_load
        load_after = cluster.loads[rep.name] + 1
        bound = load_bound(total, workers, self.config.balance_factor)
        if load_after > bound:
            self.violations += 1
        self.max_bound_use = max(self.max_bound_use, load_after / bound)
        if self.measured[req]:
            self.load_ratios.append(load_after * workers / (total + 1))
        cluster.loads[rep.name] = load_after
        cluster.total_load = total + 1
        cluster.adapter_loads[adapter] = cluster.adapter_loads.get(adapter, 0) + 1
        rep.waiting[adapter] = rep.waiting.get(adapter, 0) + 1
        self.replica_of[req] = rep.index

    def _on_fetched(self, rep: Replica, adapter: str, now: float) -> None:
        self._host_insert(rep, adapter)
        self._disk_insert(rep, adapter)
        rep.queue.extend(rep.fetching.pop(adapter))
        self._try_start(rep, now)

    def _on_complete(self, req: int, now: float) -> None:
        self.finish_s[req] = now
        self.served[req] += 1
        rep = self.replica_list[self.replica_of[req]]
        adapter = self.adapter_ids[self.ranks[req]]
        rep.running -= 1
        _decrement(rep.active, adapter)
        cluster = self.cluster
        cluster.loads[rep.name] -= 1
        cluster.total_load -= 1
        cluster.adapter_loads[adapter] -= 1
        self._try_start(rep, now)

    # Engine -------------------------------------------------------------------------------------------

    def _try_start(self, rep: Replica, now: float) -> None:
        queue, adapter_ids, ranks = rep.queue, self.adapter_ids, self.ranks
        while rep.running < self.config.max_running and queue:
            req = queue[0]
            adapter = adapter_ids[ranks[req]]
            if self._can_take_slot(rep, adapter):
                queue.popleft()
                self._admit(rep, req, adapter, now)
                continue
            # Every slot is pinned: a request whose adapter is resident may overtake the head.
            for position in range(1, min(len(queue), _SKIP_AHEAD_WINDOW)):
                other = queue[position]
                other_adapter = adapter_ids[ranks[other]]
                if other_adapter in rep.slots:
                    del queue[position]
                    self._admit(rep, other, other_adapter, now)
                    break
            else:
                return

    def _can_take_slot(self, rep: Replica, adapter: str) -> bool:
        if adapter in rep.slots or len(rep.slots) < self.config.engine_slots:
            return True
        return any(victim not in rep.active for victim in rep.slots)

    def _admit(self, rep: Replica, req: int, adapter: str, now: float) -> None:
        load_time = 0.0
        if adapter in rep.slots:
            rep.slots.move_to_end(adapter)
        else:
            self._load_into_slot(rep, adapter)
            load_time = self.copy_s
            if self.tier[req] == TIER_GPU:  # a cold request's copy is part of its cold load
                self.tier[req] = TIER_HOST
                if self.measured[req]:
                    self.host_loads += 1
        rep.running += 1
        _decrement(rep.waiting, adapter)
        rep.active[adapter] = rep.active.get(adapter, 0) + 1
        mix = (1.0 + self.mix_scale * (len(rep.active) - 1)) / self.full_mix
        begin = now + load_time
        self.begin_s[req] = begin
        self._push(begin + self.base_service_s * mix, _COMPLETE, req)

    def _load_into_slot(self, rep: Replica, adapter: str) -> None:
        if len(rep.slots) >= self.config.engine_slots:
            self._evict_one(rep)
        rep.slots[adapter] = None
        self.cluster.holders.setdefault(adapter, set()).add(rep.name)
        if adapter in rep.host:
            rep.host.move_to_end(adapter)
        else:  # evicted from host RAM since its fetch; the copy in flight to the GPU puts it back
            self._host_insert(rep, adapter)

    def _evict_one(self, rep: Replica) -> None:
        """Drop the least recently used slot whose adapter has no running request."""
        for victim in rep.slots:
            if victim not in rep.active:
                del rep.slots[victim]
                self.cluster.holders[victim].discard(rep.name)
                return

    def _host_insert(self, rep: Replica, adapter: str) -> None:
        rep.host[adapter] = None
        rep.host.move_to_end(adapter)
        if len(rep.host) > self.config.host_capacity:
            rep.host.popitem(last=False)

    # Result -------------------------------------------------------------------------------------------

    def _result(self) -> RunResult:
        picked = [r for r, keep in enumerate(self.measured) if keep]
        stats = getattr(self.policy, "stats", None)
        return RunResult(
            policy=self.policy_name,
            scenario=self.scenario,
            requests=len(self.arrival_s),
            measured=len(picked),
            served_once=all(s == 1 for s in self.served),
            latency_s=[self.finish_s[r] - self.arrival_s[r] for r in picked],
            wait_s=[self.begin_s[r] - self.arrival_s[r] for r in picked],
            tiers=[self.tier[r] for r in picked],
            host_loads=self.host_loads,
            cold_loads=self.cold_loads,
            bound_violations=self.violations,
            max_bound_use=self.max_bound_use,
            load_ratios=self.load_ratios,
            sampled_max_over_mean=self.samples,
            cold_loads_per_s=self.cold_per_s[int(self.start_measure) :],
            replica_of=[self.replica_of[r] for r in picked],
            adapter_rank=[self.ranks[r] for r in picked],
            routing_stats=(
                {"routed": stats.routed, "affinity_hits": stats.affinity_hits, "spills": stats.spills}
                if stats is not None
                else {}
            )
            | {"handoffs": self.handoffs},
            placement_fetches=self.placement_fetches,
            object_fetches=self.object_fetches,
        )


def _decrement(counts: dict[str, int], key: str) -> None:
    left = counts[key] - 1
    if left:
        counts[key] = left
    else:
        del counts[key]


def simulate(config: SimConfig, policy_name: str, traffic: Traffic, scenario: Scenario) -> RunResult:
    import time

    started = time.perf_counter()
    result = Simulation(config, policy_name, traffic, scenario).run()
    result.wall_s = time.perf_counter() - started
    return result
