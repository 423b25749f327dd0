"""Placement's plan (pure): the worker's share is exactly what the gateways' router sends it, most
requested first, within the disk budget; a join moves about 1/n of the adapters and nothing else."""

from __future__ import annotations

import hashlib

from libs.contracts import AdapterDemand, AdapterRef, DemandEntry
from libs.routing import BoundedLoadRouter
from services.worker.placement import UNKNOWN_SIZE_BYTES, make_plan, merge_demand

BASE = "smollm2-135m"


def ref(i: int, *, rank: int = 16, base: str = BASE, size: int = 1000) -> AdapterRef:
    digest = hashlib.sha256(f"adapter-{i}".encode()).hexdigest()
    return AdapterRef(digest=digest, object_key=f"adapters/{digest}/", base_model=base, rank=rank, size_bytes=size)


def demand_of(refs: list[AdapterRef]) -> dict[str, tuple[AdapterRef, float]]:
    return {r.digest: (r, float(len(refs) - i)) for i, r in enumerate(refs)}  # the first most requested


WORKERS = ("w0", "w1", "w2", "w3")


def plan(me: str, members=WORKERS, demand=None, budget=10**9, positions=1, **kw):
    refs = [ref(i) for i in range(400)]
    return make_plan(
        me,
        members,
        demand or demand_of(refs),
        base_model=kw.get("base", BASE),
        max_rank=16,
        budget_bytes=budget,
        positions=positions,
    )


def test_each_adapter_is_owned_by_exactly_the_worker_the_router_sends_it_to():
    router = BoundedLoadRouter(workers=WORKERS)
    shares = {w: {r.digest for r in plan(w).owned} for w in WORKERS}
    every = set().union(*shares.values())
    assert len(every) == 400 and sum(len(s) for s in shares.values()) == 400  # a partition
    for worker, share in shares.items():
        assert all(router.primary(digest) == worker for digest in share)
        assert 60 < len(share) < 140  # about a quarter each


def test_two_positions_place_each_adapter_on_its_owner_and_on_the_worker_the_bound_spills_it_to():
    router = BoundedLoadRouter(workers=WORKERS)
    shares = {w: {r.digest for r in plan(w, positions=2).owned} for w in WORKERS}
    assert sum(len(s) for s in shares.values()) == 800  # two copies of each of the 400
    for digest in set().union(*shares.values()):
        holders = {w for w, share in shares.items() if digest in share}
        owner = router.primary(digest)
        full = {owner: router.bound(0)}  # the owner at the bound: the request goes on
        spilled = router.route(digest, full, total_load=router.bound(0)).worker
        assert holders == {owner, spilled} and spilled != owner


def test_with_two_positions_the_owned_copies_come_before_the_spill_copies():
    router = BoundedLoadRouter(workers=WORKERS)
    got = plan("w2", positions=2).owned
    owner = [router.primary(r.digest) == "w2" for r in got]
    assert any(owner) and not all(owner)
    assert owner == sorted(owner, reverse=True)  # every owned copy, then the spill copies
    counts = demand_of([ref(i) for i in range(400)])
    for part in (got[: sum(owner)], got[sum(owner) :]):  # each part most requested first
        assert [counts[r.digest][1] for r in part] == sorted((counts[r.digest][1] for r in part), reverse=True)


def test_most_requested_first_and_the_budget_bounds_what_is_kept():
    full = plan("w1")
    counts = demand_of([ref(i) for i in range(400)])
    assert [counts[r.digest][1] for r in full.owned] == sorted((counts[r.digest][1] for r in full.owned), reverse=True)
    tight = plan("w1", budget=10_000)  # ten adapters of 1,000 bytes
    assert tight.kept == full.owned[:10] and tight.shortfall == len(full.owned) - 10


def test_an_adapter_of_unknown_size_counts_as_one_mebibyte():
    unknown = ref(1, size=0)
    got = make_plan("w0", ("w0",), {unknown.digest: (unknown, 1.0)}, base_model=BASE, max_rank=16, budget_bytes=10)
    assert got.kept == () and got.shortfall == 1
    got = make_plan(
        "w0", ("w0",), {unknown.digest: (unknown, 1.0)}, base_model=BASE, max_rank=16, budget_bytes=UNKNOWN_SIZE_BYTES
    )
    assert got.kept == (unknown,)


def test_other_bases_and_ranks_above_the_pool_are_not_placed():
    mine = [ref(1, base="other-model"), ref(2, rank=64), ref(3)]
    got = make_plan("w0", ("w0",), demand_of(mine), base_model=BASE, max_rank=16, budget_bytes=10**9)
    assert got.owned == (mine[2],)


def test_a_worker_that_joins_takes_about_a_fifth_and_nobody_else_fetches_anything():
    before = {w: {r.digest for r in plan(w).owned} for w in WORKERS}
    grown = (*WORKERS, "w4")
    after = {w: {r.digest for r in plan(w, members=grown).owned} for w in grown}
    for worker in WORKERS:  # the old members only lose adapters: nothing new to fetch
        assert after[worker] <= before[worker]
    moved = len(after["w4"])
    assert 40 < moved < 130  # about 400 / 5


def test_a_worker_not_in_the_ring_owns_nothing():
    assert plan("w9").owned == ()


def test_demand_from_every_gateway_adds_up():
    a, b = ref(1), ref(2)
    values = [
        AdapterDemand(pool="p", gateway_id="g0", adapters=[DemandEntry(ref=a, requests=3)], half_life_s=60),
        AdapterDemand(
            pool="p",
            gateway_id="g1",
            adapters=[DemandEntry(ref=a, requests=2), DemandEntry(ref=b, requests=4)],
            half_life_s=60,
        ),
    ]
    merged = merge_demand(values)
    assert merged[a.digest] == (a, 5.0) and merged[b.digest] == (b, 4.0)


def test_active_versions_nobody_requested_are_placed_after_every_requested_one_and_not_into_host_ram():
    asked, tail = [ref(i) for i in range(40)], [ref(i) for i in range(40, 400)]
    values = [
        AdapterDemand(
            pool="p",
            gateway_id="g0",
            adapters=[DemandEntry(ref=r, requests=1 + i) for i, r in enumerate(asked)],
            half_life_s=60,
        )
    ]
    active = {r.digest: r for r in asked[:5] + tail}  # requested ones are active too
    merged = merge_demand(values, active)
    assert len(merged) == 400 and all(merged[r.digest] == (r, 0.0) for r in tail)
    assert merged[asked[0].digest] == (asked[0], 1.0)  # a count is not overwritten by the active set
    got = make_plan("w0", WORKERS, merged, base_model=BASE, max_rank=16, budget_bytes=10**9)
    mine_asked = [r for r in got.owned if r in asked]
    assert got.owned[: len(mine_asked)] == tuple(mine_asked)  # every requested one first
    assert len(got.owned) > 80  # about a quarter of 400: the unrequested share is placed too
    assert got.requested == {r.digest for r in mine_asked}  # only these may go into host RAM


class FlakyDisk:
    """The disk tier over an object store that fails the first `failures` fetches."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.held: set[str] = set()
        self.calls = 0

    def contains(self, digest: str) -> bool:
        return digest in self.held

    async def get(self, ref: AdapterRef):
        self.calls += 1
        if self.calls <= self.failures:
            raise ConnectionError("S3 away")
        self.held.add(ref.digest)


async def test_a_failed_fetch_is_counted_not_cached_and_waits_before_another_try():
    import asyncio
    from types import SimpleNamespace

    from services.worker.placement import Placement

    disk = FlakyDisk(failures=1)
    settings = SimpleNamespace(
        placement_fetch_per_s=1000.0, placement_host_ram_top=0, base_model=BASE, max_lora_rank=16
    )
    placement = Placement(SimpleNamespace(worker_id="w0"), settings, SimpleNamespace(disk=disk))
    wanted = ref(7)
    await placement._fetch(wanted)
    assert placement.stats.failed == 1 and not disk.contains(wanted.digest)  # nothing half-fetched is kept
    placement._queue = [wanted]
    fetching = asyncio.create_task(placement._fetch_loop())
    placement._wake.set()
    await asyncio.sleep(0.05)
    assert disk.calls == 1  # backing off: not tried again at once
    placement._retry_at.clear()  # the backoff is over
    placement._queue = [wanted]
    placement._wake.set()
    await asyncio.sleep(0.05)
    fetching.cancel()
    assert disk.contains(wanted.digest) and placement.stats.fetched == 1
