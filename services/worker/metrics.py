"""The worker's OpenTelemetry instruments (exported to Prometheus / OTLP by libs.telemetry)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from opentelemetry import metrics

from libs.contracts import AdapterTier

# Hot to cold: a request found at tier T is a hit at T and a miss at every hotter tier.
TIER_ORDER = (AdapterTier.GPU, AdapterTier.CPU, AdapterTier.DISK, AdapterTier.OBJECT_STORE)
# How many of its hottest adapters a worker exports (one series each; see services/worker/hotness.py).
HOT_ADAPTERS = 10


@dataclass
class WorkerMetrics:
    tier_hits: metrics.Counter
    tier_misses: metrics.Counter
    load_seconds: metrics.Histogram
    requests: metrics.Counter
    tokens: metrics.Counter
    ttft_seconds: metrics.Histogram
    in_flight: metrics.UpDownCounter
    admission_wait_seconds: metrics.Histogram
    # The same tier hits as plain numbers: the OpenTelemetry counters cannot be read back, and the
    # heartbeat carries these to `lpx top` (services/worker/heartbeat.py).
    found_at: Counter[AdapterTier] = field(default_factory=Counter)

    @classmethod
    def create(cls, meter: metrics.Meter) -> WorkerMetrics:
        return cls(
            tier_hits=meter.create_counter("lpx_worker_adapter_tier_hits", description="adapter found at this tier"),
            tier_misses=meter.create_counter("lpx_worker_adapter_tier_misses", description="adapter not at this tier"),
            load_seconds=meter.create_histogram(
                "lpx_worker_adapter_load_seconds",
                unit="s",
                description="time to make an adapter usable, by source tier",
            ),
            requests=meter.create_counter("lpx_worker_requests", description="requests finished, by outcome"),
            tokens=meter.create_counter("lpx_worker_generated_tokens", description="completion tokens generated"),
            ttft_seconds=meter.create_histogram("lpx_worker_ttft_seconds", unit="s", description="time to first token"),
            in_flight=meter.create_up_down_counter("lpx_worker_in_flight", description="requests being generated"),
            admission_wait_seconds=meter.create_histogram(
                "lpx_worker_admission_wait_seconds", unit="s", description="adapter requests waiting for a slot"
            ),
        )

    def record_tier(self, tier: AdapterTier, load_s: float) -> None:
        if tier not in TIER_ORDER:
            return
        for hotter in TIER_ORDER[: TIER_ORDER.index(tier)]:
            self.tier_misses.add(1, {"tier": hotter.value})
        self.tier_hits.add(1, {"tier": tier.value})
        self.found_at[tier] += 1
        self.load_seconds.record(load_s, {"tier": tier.value})


def register_queue_gauges(meter: metrics.Meter, worker) -> None:
    """Observable instruments read from the worker's live state at scrape time. Each carries the worker
    and its pool, so that dashboards can group by pool without a join."""
    labels = {"worker": worker.worker_id, "pool": worker.settings.pool}
    info = {**labels, "base_model": worker.settings.base_model, "engine": worker.settings.engine}

    def gauge(name: str, value, description: str, unit: str = "") -> None:
        def observe(_options):
            yield metrics.Observation(value(), labels)

        meter.create_observable_gauge(name, [observe], unit=unit, description=description)

    # Always 1: one series per running worker, so `count by (pool)` counts a pool's workers and other
    # worker series can take the pool label from it (`* on (instance) group_left (pool)`).
    meter.create_observable_gauge(
        "lpx_worker_info",
        [lambda _options: [metrics.Observation(1, info)]],
        description="one per running worker: its pool, base model and engine",
    )
    gauge("lpx_worker_queue_depth", lambda: worker.queue_depth, "messages waiting")
    if worker.admission is not None:
        _register_admission(meter, worker, labels)
    if worker.batch_share is not None:
        share = worker.batch_share
        gauge("lpx_worker_batch_running", lambda: share.total, "sequences the batch share lets run now")
        gauge("lpx_worker_batch_waiting", lambda: share.waiting, "requests held for a place in the batch")
        gauge("lpx_worker_batch_limit", share.current_limit, "batch size tenants over their share may fill now")
        gauge(
            "lpx_worker_batch_protected_limit",
            lambda: share.protected_limit,
            "batch size while a tenant below its share has work (derived from the engine profile)",
        )
    gauge("lpx_worker_disk_cache_bytes", lambda: worker.tiers.disk.stats.bytes, "disk tier size")
    gauge("lpx_worker_tokens_per_second", worker.tokens_per_s, "recent tok/s")
    placement = getattr(worker, "placement", None)
    if placement is not None:  # services/worker/placement.py: this worker's share of the ring
        stats = placement.stats
        gauge("lpx_worker_placement_owned", lambda: stats.owned, "adapters the ring gives this worker (with demand)")
        gauge("lpx_worker_placement_resident", lambda: stats.resident, "owned adapters on this worker's disk")
        gauge("lpx_worker_placement_backlog", lambda: stats.backlog, "owned adapters waiting to be fetched")
        gauge("lpx_worker_placement_shortfall", lambda: stats.shortfall, "owned adapters beyond the disk budget")
        meter.create_observable_counter(
            "lpx_worker_placement_fetches",
            [
                lambda _o: [
                    metrics.Observation(stats.fetched, {**labels, "outcome": "ok"}),
                    metrics.Observation(stats.failed, {**labels, "outcome": "failed"}),
                ]
            ],
            description="background fetches of owned adapters into the disk tier",
        )
    _register_adapters(meter, worker, labels)


def _register_adapters(meter: metrics.Meter, worker, labels: dict) -> None:
    tiers = worker.tiers

    def evictions(_options):
        # gpu and cpu as the tiers mirror the engine; the disk cache counts its own.
        counts = {tier: tiers.evictions[tier] for tier in (AdapterTier.GPU, AdapterTier.CPU)}
        counts[AdapterTier.DISK] = tiers.disk.stats.evictions
        return [metrics.Observation(n, {**labels, "tier": tier.value}) for tier, n in counts.items()]

    def hottest(_options):
        top = tiers.hotness.top(HOT_ADAPTERS)
        return [metrics.Observation(n, {**labels, "adapter": digest[:12]}) for digest, n in top]

    evicted = "adapters that left a tier: a gpu slot, the host-RAM cache, the disk cache"
    meter.create_observable_counter("lpx_worker_adapter_evictions", [evictions], description=evicted)
    hot = f"requests per adapter (digest prefix), for this worker's {HOT_ADAPTERS} hottest adapters now"
    meter.create_observable_counter("lpx_worker_adapter_requests", [hottest], description=hot)


def _register_admission(meter: metrics.Meter, worker, labels: dict) -> None:
    admission = worker.admission

    def swaps(_options):
        yield metrics.Observation(admission.stats.slot_swaps, labels)

    def waiting(_options):
        yield metrics.Observation(admission.waiting, labels)

    def oldest(_options):
        yield metrics.Observation(admission.oldest_wait_s(), labels)

    def longest(_options):
        yield metrics.Observation(admission.stats.longest_wait_s, labels)

    meter.create_observable_counter(
        "lpx_worker_adapter_slot_swaps", [swaps], description="adapter slots given to an adapter that did not hold one"
    )
    meter.create_observable_gauge("lpx_worker_admission_waiting", [waiting], description="requests waiting for a slot")
    meter.create_observable_gauge(
        "lpx_worker_admission_oldest_wait_seconds",
        [oldest],
        unit="s",
        description="how long the oldest request waiting for a slot has waited",
    )
    meter.create_observable_gauge(
        "lpx_worker_admission_longest_wait_seconds",
        [longest],
        unit="s",
        description="the longest slot wait since the worker started",
    )
