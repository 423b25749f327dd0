"""The workers' placement (services/worker/placement.py) in the simulator, with Scenario.placement: each
replica fetches the adapters the ring gives it (the first `placement_successors` of each adapter's ring
order), most requested first, at `placement_fetch_per_s`, into its local disk tier when the
configuration has one (`disk_cache_adapters`, as the workers do), else into its host cache, up to that
tier's capacity. Those fetches are not requests' cold loads: a request that finds its adapter in host
RAM is a host hit, one that finds it on disk a disk load, not an object-store fetch.

What "most requested" means follows `placement_demand`, re-planned every `placement_interval_s`:
"active" (the workers: the requests seen so far first, as the gateways count them, then every other
active adapter, in digest order: the registry's active set), "seen" (the requested ones alone: an
adapter nobody asked for yet is not placed) or "oracle" (the true popularity, planned once at time 0:
the bound). With churn (Scenario.churn_every_s) a replica leaves the pool and comes back empty at that
period, one at a time: the ring moves, every replica fetches the share that moved to it, and the
returning replica its whole share again, at the same rate.
"""

from __future__ import annotations

import hashlib

from libs.routing import HashRing
from libs.simulator.cluster import Replica

_PLACED, _CHURN, _REPLAN = 2, 3, 4  # event kinds, after the engine's _COMPLETE and _FETCHED


class PlacementEvents:
    """Placement and churn events of `libs.simulator.engine.Simulation`: a mixin over its state
    (cluster, replica_list, policy, config, scenario, adapter_ids, end_measure, _push)."""

    def _start_placement(self, names: list[str]) -> None:
        self.demand: dict[str, int] = {}  # adapter -> requests seen so far (the gateways' demand counts)
        self.placement_fetches = 0
        self.members = list(names)
        self.placed_at: dict[int, float] = {}  # replica -> when its placement fetcher is free again
        self.to_place: dict[int, set[str]] = {}  # replica -> adapters whose placement fetch is queued
        # The registry's active set in digest order (unrelated to popularity): what "active" places last.
        self._digest_order = sorted(self.adapter_ids, key=lambda a: hashlib.sha256(a.encode()).digest())
        if not self.scenario.placement:
            return
        if self.config.placement_demand != "seen":  # "seen" has nothing to place at time 0
            self._place(0.0)
        if self.config.placement_demand != "oracle":
            self._push(self.config.placement_interval_s, _REPLAN, None)
        if self.scenario.churn_every_s > 0:
            self._push(self.scenario.churn_every_s, _CHURN, 0)

    def _on_placement_event(self, kind: int, first: object, second: object, now: float) -> None:
        if kind == _PLACED:
            self._on_placed(self.replica_list[first], second)
        elif kind == _CHURN:
            self._on_churn(first, now)
        else:
            self._place(now)
            if now + self.config.placement_interval_s < self.end_measure:
                self._push(now + self.config.placement_interval_s, _REPLAN, None)

    def _ranked(self) -> list[str]:
        if self.config.placement_demand == "oracle":
            return self.adapter_ids  # most popular first
        seen = sorted(self.demand, key=lambda adapter: (-self.demand[adapter], adapter))
        if self.config.placement_demand == "seen":
            return seen
        # "active": then every other active adapter, in digest order (unrelated to its popularity)
        return seen + [a for a in self._digest_order if a not in self.demand]

    def _placement_tier(self, rep: Replica):
        if self.config.disk_cache_adapters:
            return rep.disk, self.config.disk_cache_adapters
        return rep.host, self.config.host_capacity

    def _place(self, now: float) -> None:
        """Every member fetches what the ring over the members gives it and it does not hold yet, at the
        placement rate (queued behind what it is still fetching), in the workers' order: the requested
        adapters first, owned copies before spill copies, most requested first; then the active adapters
        nobody requested yet, owned before spill copies (sorting by tail, position, rank)."""
        ring = HashRing(self.members, vnodes=self.config.vnodes)
        owned: dict[str, list[tuple]] = {name: [] for name in self.members}
        active = self.config.placement_demand == "active"
        for index, adapter in enumerate(self._ranked()):
            tail = active and adapter not in self.demand
            for position, name in enumerate(ring.preference_list(adapter)[: self.config.placement_successors]):
                owned[name].append((tail, position, index, adapter))
        gap = 1.0 / self.config.placement_fetch_per_s
        for name, entries in owned.items():
            adapters = [adapter for *_, adapter in sorted(entries)]
            rep = self.cluster.replicas[name]
            tier, capacity = self._placement_tier(rep)
            queued = self.to_place.setdefault(rep.index, set())
            at = max(now, self.placed_at.get(rep.index, now))
            for adapter in adapters[:capacity]:
                if adapter in tier or adapter in queued:
                    continue
                at += gap
                queued.add(adapter)
                self._push(at, _PLACED, rep.index, adapter)
            self.placed_at[rep.index] = at

    def _on_placed(self, rep: Replica, adapter: str) -> None:
        self.to_place.get(rep.index, set()).discard(adapter)
        tier, capacity = self._placement_tier(rep)
        if rep.name not in self.members or adapter in tier or adapter in rep.fetching:
            return
        self.placement_fetches += 1
        tier[adapter] = None
        tier.move_to_end(adapter, last=False)  # pre-loaded, not used: first to go if room is short
        if len(tier) > capacity:
            tier.popitem(last=False)

    def _disk_insert(self, rep: Replica, adapter: str) -> None:
        """A fetched adapter stays on local disk (LRU), when the configuration models a disk tier."""
        if not self.config.disk_cache_adapters:
            return
        rep.disk[adapter] = None
        rep.disk.move_to_end(adapter)
        if len(rep.disk) > self.config.disk_cache_adapters:
            rep.disk.popitem(last=False)

    def _on_churn(self, turn: int, now: float) -> None:
        """Replica `turn` leaves (the ring moves), comes back empty half a period later (it moves back)."""
        name = self.replica_list[turn % len(self.replica_list)].name
        if name in self.members:
            self.members.remove(name)
            self.policy.set_workers(self.members)
            rep = self.cluster.replicas[name]
            rep.host.clear()
            rep.disk.clear()
            self.placed_at.pop(rep.index, None)
            self.to_place.pop(rep.index, None)
            self._place(now)
            self._next_churn(now, turn)
            return
        self.members.append(name)
        self.policy.set_workers(self.members)
        self._place(now)
        self._next_churn(now, turn + 1)

    def _next_churn(self, now: float, turn: int) -> None:
        at = now + self.scenario.churn_every_s / 2
        if at < self.end_measure:  # nothing after the run: the event loop ends when the heap is empty
            self._push(at, _CHURN, turn)
