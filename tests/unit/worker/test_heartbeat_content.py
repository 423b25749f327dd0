"""What a worker's heartbeat tells `lpx top` and `lpx adapter where`: slot limits, tokens generated,
tier hits, its hottest adapters' request counts, and since when each adapter is in its tier."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from opentelemetry.sdk.metrics import MeterProvider

from libs.contracts import AdapterTier, WorkerHeartbeat
from services.worker.batch_share import BatchShare
from services.worker.heartbeat import DISK_DIGESTS_IN_BEAT, Heartbeater, TierTenure
from services.worker.hotness import AdapterHotness
from services.worker.metrics import WorkerMetrics
from services.worker.placement import PlacementStats

A, B, C = "a" * 64, "b" * 64, "c" * 64
GPU, CPU, DISK = AdapterTier.GPU, AdapterTier.CPU, AdapterTier.DISK


def test_an_adapter_keeps_its_since_while_it_stays_in_its_tier():
    tenure = TierTenure()
    assert tenure.update({GPU: [A], CPU: [B]}, now=10.0) == {A: 10.0, B: 10.0}  # resident at the first beat
    assert tenure.update({GPU: [A], CPU: [B], DISK: [C]}, now=12.0) == {A: 10.0, B: 10.0, C: 12.0}
    assert tenure.update({GPU: [B], CPU: [A], DISK: [C]}, now=14.0) == {A: 14.0, B: 14.0, C: 12.0}  # swapped
    assert tenure.update({GPU: [B]}, now=16.0) == {B: 14.0}  # A and C left every tier: forgotten
    assert tenure.update({GPU: [B], DISK: [A]}, now=18.0) == {B: 14.0, A: 18.0}  # A is back: a new since


class FakeTiers:
    def __init__(self) -> None:
        self.hotness = AdapterHotness()
        self.tiers = {GPU: [A], CPU: [B], DISK: [C]}

    async def resident(self):
        return {tier: list(digests) for tier, digests in self.tiers.items()}


class FakeKV:
    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}

    async def put(self, key: str, value: bytes) -> None:
        self.values[key] = value


def beating(tiers: FakeTiers, metrics=None, **settings) -> Heartbeater:
    """A Heartbeater for a worker `w` with these tiers, writing to a FakeKV."""
    limits = dict(pool="p", base_model="m", max_lora_rank=16, capacity=1, max_loras=1, max_cpu_loras=1)
    worker = SimpleNamespace(
        worker_id="w",
        settings=SimpleNamespace(**{**limits, **settings}),
        in_flight=0,
        own_pending=0,
        tiers=tiers,
        metrics=metrics or WorkerMetrics.create(MeterProvider().get_meter("test")),
        batch_share=None,
        placement=SimpleNamespace(stats=PlacementStats()),
    )
    heartbeater = Heartbeater(link=None, worker=worker, interval_s=1.0, ttl_s=5.0)
    heartbeater.kv = FakeKV()
    return heartbeater


async def test_a_beat_carries_what_top_and_where_need(monkeypatch):
    clock = iter([100.0, 102.0])
    monkeypatch.setattr("services.worker.heartbeat.time", SimpleNamespace(time=lambda: next(clock)))
    settings = SimpleNamespace(
        pool="p16", base_model="smollm2-135m", max_lora_rank=16, capacity=8, max_loras=4, max_cpu_loras=12
    )
    metrics = WorkerMetrics.create(MeterProvider().get_meter("test"))
    for tier in (GPU, GPU, GPU, CPU, AdapterTier.OBJECT_STORE):
        metrics.record_tier(tier, 0.01)
    tiers = FakeTiers()
    for digest in (A, A, A, B):
        tiers.hotness.used(digest)
    worker = SimpleNamespace(
        worker_id="sim-0",
        settings=settings,
        in_flight=2,
        own_pending=1,
        tiers=tiers,
        metrics=metrics,
        processor=SimpleNamespace(generated_tokens=1234),
        batch_share=BatchShare(limit=8, protected_limit=5, most=16),
        placement=SimpleNamespace(stats=PlacementStats(owned=40, resident=31, backlog=9)),
    )
    worker.batch_share.running.update({"flood": 8, "calm": 1})  # a tenant below its share has work
    heartbeater = Heartbeater(link=None, worker=worker, interval_s=1.0, ttl_s=5.0)
    heartbeater.kv = FakeKV()

    await heartbeater.beat()
    first = WorkerHeartbeat.model_validate_json(heartbeater.kv.values["sim-0"])
    assert (first.max_loras, first.max_cpu_loras, first.generated_tokens) == (4, 12, 1234)
    assert first.tier_hits == {GPU: 3, CPU: 1, AdapterTier.OBJECT_STORE: 1}
    assert first.adapter_requests == {A: 3, B: 1}
    assert first.adapter_since == {A: 100.0, B: 100.0, C: 100.0}
    assert (first.batch_running, first.batch_limit) == (9, 5)
    assert (first.placement_owned, first.placement_resident, first.placement_backlog) == (40, 31, 9)

    tiers.tiers = {GPU: [A], CPU: [], DISK: [B, C]}  # B left the engine's host cache
    await heartbeater.beat()
    second = WorkerHeartbeat.model_validate_json(heartbeater.kv.values["sim-0"])
    assert second.adapter_since == {A: 100.0, B: 102.0, C: 100.0}


async def test_a_beat_before_the_worker_consumes_counts_no_tokens():
    heartbeater = beating(FakeTiers())
    await heartbeater.beat()
    beat = WorkerHeartbeat.model_validate_json(heartbeater.kv.values["w"])
    assert beat.generated_tokens == 0 and (beat.batch_running, beat.batch_limit) == (0, 0)  # no batch share


async def test_a_worker_with_thousands_of_adapters_on_disk_beats_in_a_bounded_message():
    """A beat is one KV value (1 MiB at most): unbounded, 10,000 disk adapters with their since times
    were ~1.5 MB and the worker would drop out of its pool. The disk list keeps its most recent; the
    count stays whole."""
    tiers = FakeTiers()
    on_disk = [f"{i:064x}" for i in range(10_000)]  # most recent first, as the disk cache lists them
    tiers.tiers = {GPU: [A], CPU: [B], DISK: on_disk}
    heartbeater = beating(tiers, max_loras=4, max_cpu_loras=8)
    await heartbeater.beat()
    raw = heartbeater.kv.values["w"]
    assert len(raw) < 128 * 1024, len(raw)
    sent = WorkerHeartbeat.model_validate_json(raw)
    assert sent.adapters[DISK] == on_disk[:DISK_DIGESTS_IN_BEAT] and sent.adapters[GPU] == [A]
    assert sent.adapter_counts == {GPU: 1, CPU: 1, DISK: 10_000}
    assert set(sent.adapter_since) == {A, B, *on_disk[:DISK_DIGESTS_IN_BEAT]}


async def test_a_halted_heartbeat_stops_even_when_a_beat_swallows_the_cancel():
    """Python 3.11's wait_for can swallow a cancel that lands as its inner future completes (nats-py's
    publish awaits one): the loop must still stop, or a 'crashed' worker would stay in the pool."""
    heartbeater = beating(FakeTiers())
    heartbeater.interval_s = 0.001  # the beats take all the time: the cancel lands inside one
    beats, swallowing = [], [True]

    async def beat_that_swallows_cancel():
        beats.append(1)
        try:
            await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            if not swallowing[0]:
                raise
            # else: what the wait_for race looks like from outside

    heartbeater.beat = beat_that_swallows_cancel
    heartbeater.start()
    try:
        await asyncio.sleep(0.12)
        heartbeater.halt()
        await asyncio.sleep(0.08)
        after_halt = len(beats)
        await asyncio.sleep(0.2)
        assert len(beats) == after_halt, "the loop kept beating after halt()"
        assert heartbeater._task.done()
        await heartbeater.beat_if_beating()
        assert len(beats) == after_halt
    finally:
        swallowing[0] = False  # a failed test must not leave an unstoppable task behind
        heartbeater._task.cancel()
