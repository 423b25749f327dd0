"""The workers' placement (services/worker/placement.py) in the simulator, with Scenario.placement: from
time 0 each replica fetches the adapters the ring gives it (the first `placement_successors` of each
adapter's ring order), most popular first, at `placement_fetch_per_s`, into its host cache up to its
capacity. Those fetches are not requests' cold loads: a request that finds its adapter there is a host
hit. With churn (Scenario.churn_every_s) a replica leaves the pool and comes back empty at that period,
one at a time: the ring moves, every replica fetches the share that moved to it, and the returning
replica its whole share again, at the same rate.
"""

from __future__ import annotations

from libs.routing import HashRing
from libs.simulator.cluster import Replica

_PLACED, _CHURN = 2, 3  # event kinds, after the engine's _COMPLETE and _FETCHED


class PlacementEvents:
    """Placement and churn events of `libs.simulator.engine.Simulation`: a mixin over its state
    (members, placed_at, cluster, replica_list, policy, config, scenario, end_measure, _push)."""

    def _place(self, now: float) -> None:
        """Every member fetches what the ring over the members gives it and it does not hold yet, most
        popular first, at the placement rate (queued behind what it is still fetching)."""
        ring = HashRing(self.members, vnodes=self.config.vnodes)
        owned: dict[str, list[str]] = {name: [] for name in self.members}
        for adapter in self.adapter_ids:  # most popular first
            for name in ring.preference_list(adapter)[: self.config.placement_successors]:
                owned[name].append(adapter)
        gap = 1.0 / self.config.placement_fetch_per_s
        for name, adapters in owned.items():
            rep = self.cluster.replicas[name]
            at = max(now, self.placed_at.get(rep.index, now))
            for adapter in adapters[: self.config.host_capacity]:
                if adapter in rep.host:
                    continue
                at += gap
                self._push(at, _PLACED, rep.index, adapter)
            self.placed_at[rep.index] = at

    def _on_placed(self, rep: Replica, adapter: str) -> None:
        if rep.name not in self.members or adapter in rep.host or adapter in rep.fetching:
            return
        self.placement_fetches += 1
        rep.host[adapter] = None
        rep.host.move_to_end(adapter, last=False)  # pre-loaded, not used: first to go if room is short
        if len(rep.host) > self.config.host_capacity:
            rep.host.popitem(last=False)

    def _on_churn(self, turn: int, now: float) -> None:
        """Replica `turn` leaves (the ring moves), comes back empty half a period later (it moves back)."""
        name = self.replica_list[turn % len(self.replica_list)].name
        if name in self.members:
            self.members.remove(name)
            self.policy.set_workers(self.members)
            rep = self.cluster.replicas[name]
            rep.host.clear()
            self.placed_at.pop(rep.index, None)
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
