"""What the adapter-tiers dashboard reads from a worker: evictions per tier, the hottest adapters, and
one info series per worker carrying its pool."""

from __future__ import annotations

from types import SimpleNamespace

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from libs.contracts import AdapterTier
from libs.engine import lora_int_id
from services.worker.batch_share import BatchShare
from services.worker.disk_cache import DiskCache
from services.worker.hotness import AdapterHotness
from services.worker.metrics import HOT_ADAPTERS, register_queue_gauges
from services.worker.tiers import AdapterTiers
from tests.unit.worker.test_disk_cache_and_capacity import FakeStore, _adapter_files, _ref


class FakeEngine:
    def __init__(self) -> None:
        self.loaded: set[int] = set()

    async def add_adapter(self, spec) -> None:
        self.loaded.add(lora_int_id(spec.digest))

    async def loaded_adapters(self) -> set[int]:
        return set(self.loaded)


def _tiers(tmp_path, count: int, max_loras: int = 1, max_cpu_loras: int = 2):
    made = [_adapter_files(tmp_path, i) for i in range(count)]
    disk = DiskCache(tmp_path / "cache", 100_000, FakeStore({d: p for p, d in made}))
    engine = FakeEngine()
    tiers = AdapterTiers(disk, engine, base_model="b", max_rank=16, max_loras=max_loras, max_cpu_loras=max_cpu_loras)
    return tiers, engine, [d for _, d in made]


async def _use(tiers: AdapterTiers, digest: str) -> AdapterTier:
    lease = await tiers.acquire(_ref(digest))
    tiers.release(lease)
    return lease.tier


def test_the_hottest_adapters_are_the_recent_ones_with_their_counts():
    now = [0.0]
    hot = AdapterHotness(half_life_s=60, clock=lambda: now[0])
    for _ in range(10):
        hot.used("old")
    now[0] = 600.0  # ten half-lives later "old" weighs 10 / 1024
    hot.used("new")
    hot.used("other")
    assert hot.top(2) == [("new", 1), ("other", 1)]  # ties by digest
    assert hot.top(5)[-1] == ("old", 10)  # still counted, just not hot


async def test_evictions_are_counted_per_tier_and_prewarms_are_not_requests(tmp_path):
    tiers, engine, digests = _tiers(tmp_path, 3)
    assert [await _use(tiers, d) for d in digests] == [AdapterTier.OBJECT_STORE] * 3
    # one slot: each new adapter takes it from the last; two host-RAM places: the first adapter left
    assert tiers.evictions[AdapterTier.GPU] == 2 and tiers.evictions[AdapterTier.CPU] == 1
    engine.loaded.discard(lora_int_id(digests[2]))  # the engine dropped one the mirror still held
    await tiers.resident()
    assert tiers.evictions[AdapterTier.CPU] == 2
    await tiers.prewarm(_ref(digests[0]))
    assert dict(tiers.hotness.top(5)) == dict.fromkeys(digests, 1)


async def test_worker_exports_its_pool_evictions_and_hottest_adapters(tmp_path):
    tiers, _, digests = _tiers(tmp_path, 2)
    for digest in (digests[0], digests[1], digests[1]):
        await _use(tiers, digest)
    reader = InMemoryMetricReader()
    worker = SimpleNamespace(
        worker_id="w-1",
        settings=SimpleNamespace(pool="p", base_model="b", engine="sim"),
        queue_depth=3,
        admission=None,
        batch_share=BatchShare(limit=16, protected_limit=9, most=32),
        tiers=tiers,
        tokens_per_s=lambda: 7.0,
    )
    register_queue_gauges(MeterProvider(metric_readers=[reader]).get_meter("t"), worker)
    points = {
        (metric.name, tuple(sorted(point.attributes.items()))): point.value
        for resource in reader.get_metrics_data().resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        for point in metric.data.data_points
    }
    who = (("pool", "p"), ("worker", "w-1"))
    assert points[("lpx_worker_info", (("base_model", "b"), ("engine", "sim"), *who))] == 1
    assert points[("lpx_worker_queue_depth", who)] == 3
    assert points[("lpx_worker_batch_limit", who)] == 16 and points[("lpx_worker_batch_protected_limit", who)] == 9
    evictions = {
        dict(attrs)["tier"]: v for (name, attrs), v in points.items() if name == "lpx_worker_adapter_evictions"
    }
    assert evictions == {"gpu": 1, "cpu": 0, "disk": 0}
    hottest = {
        dict(attrs)["adapter"]: v for (name, attrs), v in points.items() if name == "lpx_worker_adapter_requests"
    }
    assert hottest == {digests[0][:12]: 1, digests[1][:12]: 2} and len(hottest) <= HOT_ADAPTERS
