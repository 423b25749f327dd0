"""The worker's OpenTelemetry instruments (exported to Prometheus / OTLP by libs.telemetry)."""

from __future__ import annotations

from dataclasses import dataclass

from opentelemetry import metrics

from libs.contracts import AdapterTier

# Hot to cold: a request found at tier T is a hit at T and a miss at every hotter tier.
TIER_ORDER = (AdapterTier.GPU, AdapterTier.CPU, AdapterTier.DISK, AdapterTier.OBJECT_STORE)


@dataclass
class WorkerMetrics:
    tier_hits: metrics.Counter
    tier_misses: metrics.Counter
    load_seconds: metrics.Histogram
    evictions: metrics.Counter
    requests: metrics.Counter
    tokens: metrics.Counter
    ttft_seconds: metrics.Histogram
    in_flight: metrics.UpDownCounter
    admission_wait_seconds: metrics.Histogram

    @classmethod
    def create(cls, meter: metrics.Meter) -> WorkerMetrics:
        return cls(
            tier_hits=meter.create_counter("lpx_worker_adapter_tier_hits", description="adapter found at this tier"),
            tier_misses=meter.create_counter("lpx_worker_adapter_tier_misses", description="adapter not at this tier"),
            load_seconds=meter.create_histogram("lpx_worker_adapter_load_seconds", unit="s",
                                                description="time to make an adapter usable, by source tier"),
            evictions=meter.create_counter("lpx_worker_adapter_evictions", description="adapters evicted, by tier"),
            requests=meter.create_counter("lpx_worker_requests", description="requests finished, by outcome"),
            tokens=meter.create_counter("lpx_worker_generated_tokens", description="completion tokens generated"),
            ttft_seconds=meter.create_histogram("lpx_worker_ttft_seconds", unit="s", description="time to first token"),
            in_flight=meter.create_up_down_counter("lpx_worker_in_flight", description="requests being generated"),
            admission_wait_seconds=meter.create_histogram("lpx_worker_admission_wait_seconds", unit="s",
                                                          description="adapter requests waiting for a slot"),
        )  # fmt: skip

    def record_tier(self, tier: AdapterTier, load_s: float) -> None:
        if tier not in TIER_ORDER:
            return
        for hotter in TIER_ORDER[: TIER_ORDER.index(tier)]:
            self.tier_misses.add(1, {"tier": hotter.value})
        self.tier_hits.add(1, {"tier": tier.value})
        self.load_seconds.record(load_s, {"tier": tier.value})


def register_queue_gauges(meter: metrics.Meter, worker) -> None:
    """Observable gauges read from the worker's live state at scrape time."""

    def queue_depth(_options):
        yield metrics.Observation(worker.queue_depth, {"worker": worker.worker_id})

    def disk_bytes(_options):
        yield metrics.Observation(worker.tiers.disk.stats.bytes, {"worker": worker.worker_id})

    def tokens_per_s(_options):
        yield metrics.Observation(worker.tokens_per_s(), {"worker": worker.worker_id})

    meter.create_observable_gauge("lpx_worker_queue_depth", [queue_depth], description="messages waiting")
    if worker.admission is not None:
        _register_admission(meter, worker)
    meter.create_observable_gauge("lpx_worker_disk_cache_bytes", [disk_bytes], description="disk tier size")
    meter.create_observable_gauge("lpx_worker_tokens_per_second", [tokens_per_s], description="recent tok/s")


def _register_admission(meter: metrics.Meter, worker) -> None:
    admission, labels = worker.admission, {"worker": worker.worker_id}

    def swaps(_options):
        yield metrics.Observation(admission.stats.slot_swaps, labels)

    def waiting(_options):
        yield metrics.Observation(admission.waiting, labels)

    def oldest(_options):
        yield metrics.Observation(admission.oldest_wait_s(), labels)

    def longest(_options):
        yield metrics.Observation(admission.stats.longest_wait_s, labels)

    meter.create_observable_counter("lpx_worker_adapter_slot_swaps", [swaps],
                                    description="adapter slots given to an adapter that did not hold one")  # fmt: skip
    meter.create_observable_gauge("lpx_worker_admission_waiting", [waiting], description="requests waiting for a slot")
    meter.create_observable_gauge("lpx_worker_admission_oldest_wait_seconds", [oldest], unit="s",
                                  description="how long the oldest request waiting for a slot has waited")  # fmt: skip
    meter.create_observable_gauge("lpx_worker_admission_longest_wait_seconds", [longest], unit="s",
                                  description="the longest slot wait since the worker started")  # fmt: skip
