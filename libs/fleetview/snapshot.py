"""One view of the fleet from samples: pure functions, no I/O (what the collector read goes in)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field

from libs.contracts import AdapterTier, WorkerHeartbeat

# Hot to cold, the order every table shows tiers in.
TIERS = (AdapterTier.GPU, AdapterTier.CPU, AdapterTier.DISK, AdapterTier.OBJECT_STORE)


@dataclass(frozen=True)
class BeatPair:
    """A worker's newest heartbeat and an older one of the same process (None: no rate yet)."""

    newer: WorkerHeartbeat
    older: WorkerHeartbeat | None = None

    def rate(self, value) -> float | None:
        """Per second between the two beats of `value(beat)`, a counter; None without two beats."""
        if self.older is None or self.newer.ts <= self.older.ts:
            return None
        return max(0, value(self.newer) - value(self.older)) / (self.newer.ts - self.older.ts)


@dataclass(frozen=True)
class Placement:
    """Where one adapter is on one worker."""

    worker_id: str
    pool: str
    tier: AdapterTier
    since: float | None  # unix time it entered this tier; None: the worker does not say
    requests: int | None  # requests it served on this worker since it started; None: not among its hottest


@dataclass(frozen=True)
class WorkerRow:
    worker_id: str
    pool: str
    base_model: str
    instance: str
    beat_age_s: float
    in_flight: int
    capacity: int
    queued: int
    gpu_adapters: int
    max_loras: int  # 0: unknown (a worker from before heartbeats carried it)
    cpu_adapters: int
    max_cpu_loras: int
    disk_adapters: int
    generated_tokens: int
    tok_s: float | None
    tier_hits: dict[str, int]
    batch_running: int  # running in the engine's batch / what over-share tenants may fill now (0: no share)
    batch_limit: int
    hit_rates: dict[str, float]  # share of the worker's adapter requests found at each tier
    # Placement: adapters the ring gives this worker (with demand), those on its disk, those still to fetch.
    placement_owned: int = 0
    placement_resident: int = 0
    placement_backlog: int = 0
    # Messages this worker passed to the pool over the pool's load bound (services/worker/load_bound.py).
    passed_on: int = 0


@dataclass(frozen=True)
class PoolRow:
    pool: str
    workers: int
    in_flight: int
    capacity: int
    queued: int
    tok_s: float | None


@dataclass(frozen=True)
class AdapterRow:
    digest: str
    req_s: float | None  # None: no worker has two beats that count it
    requests: int  # counted by the workers that have it among their hottest, each since it started
    placements: tuple[Placement, ...]
    name: str | None = None  # "tenant/adapter vN" when the registry names this digest's version


@dataclass(frozen=True)
class TenantRow:
    tenant: str
    req_s: float | None  # admitted by the gateways; None: no gateway reported in the window
    in_flight: int
    by_status: dict[str, float] = field(default_factory=dict)  # HTTP status -> req/s (with --metrics)


@dataclass(frozen=True)
class ConsumerDepth:
    name: str
    pending: int  # in the stream for this consumer, not delivered yet
    ack_pending: int  # delivered, not acknowledged yet (being worked on)


@dataclass(frozen=True)
class StreamDepth:
    stream: str
    messages: int
    consumers: tuple[ConsumerDepth, ...] = ()


@dataclass(frozen=True)
class TenantWindow:
    """What the gateways' limit reports said between two samples."""

    window_s: float
    requests: dict[str, int]  # tenant -> requests admitted in the window
    in_flight: dict[str, int]  # tenant -> requests in flight now, over every gateway
    gateways: tuple[str, ...]


@dataclass(frozen=True)
class FleetSnapshot:
    taken_at: float
    nats_url: str
    workers: tuple[WorkerRow, ...]
    pools: tuple[PoolRow, ...]
    adapters: tuple[AdapterRow, ...]
    tenants: tuple[TenantRow, ...]
    gateways: tuple[str, ...]
    streams: tuple[StreamDepth, ...]
    window_s: float  # the time tenant rates are over
    notes: tuple[str, ...] = ()  # what could not be read, and why

    def to_json(self) -> dict:
        return asdict(self)


def placements(beats: Iterable[WorkerHeartbeat], digest: str) -> list[Placement]:
    """Every worker holding `digest`, hottest tier first, then by worker."""
    found = []
    for beat in beats:
        for tier in TIERS:
            if digest in beat.adapters.get(tier, ()):
                found.append(
                    Placement(
                        beat.worker_id,
                        beat.pool,
                        tier,
                        beat.adapter_since.get(digest),
                        beat.adapter_requests.get(digest),
                    )
                )
                break
    return sorted(found, key=lambda p: (TIERS.index(p.tier), p.worker_id))


def placed_on(
    beats: Iterable[WorkerHeartbeat], digest: str, base_model: str | None = None, positions: int = 1
) -> dict[str, tuple[str, ...]]:
    """Per pool (of `base_model`, if given), the first `positions` workers of `digest`'s ring order: the
    first is where the gateways route it when nobody is over the load bound, the next where the bound
    sends it while that one is full; each pre-loads it (placement, LPX_WORKER_PLACEMENT_POSITIONS)."""
    from libs.routing import HashRing

    pools: dict[str, list[str]] = {}
    for beat in beats:
        if base_model is None or beat.base_model == base_model:
            pools.setdefault(beat.pool, []).append(beat.worker_id)
    return {pool: HashRing(workers).preference_list(digest)[:positions] for pool, workers in sorted(pools.items())}


def unlisted_disk(beats: Iterable[WorkerHeartbeat], digest: str) -> list[str]:
    """Workers that may hold `digest` on disk without naming it: their beats list only the most recent
    of more disk adapters (and do not name it in any tier)."""
    return sorted(
        beat.worker_id
        for beat in beats
        if resident_count(beat, AdapterTier.DISK) > len(beat.adapters.get(AdapterTier.DISK, ()))
        and not any(digest in beat.adapters.get(tier, ()) for tier in TIERS)
    )


def resident_count(beat: WorkerHeartbeat, tier: AdapterTier) -> int:
    """How many adapters the worker holds in `tier` (its beat may list only the most recent)."""
    return beat.adapter_counts.get(tier, len(beat.adapters.get(tier, ())))


def worker_row(pair: BeatPair, now: float) -> WorkerRow:
    beat = pair.newer
    hits = {tier.value: beat.tier_hits.get(tier, 0) for tier in TIERS}
    total = sum(hits.values())
    return WorkerRow(
        worker_id=beat.worker_id,
        pool=beat.pool,
        base_model=beat.base_model,
        instance=beat.instance,
        beat_age_s=max(0.0, now - beat.ts),
        in_flight=beat.in_flight,
        capacity=beat.capacity,
        queued=beat.queued,
        gpu_adapters=resident_count(beat, AdapterTier.GPU),
        max_loras=beat.max_loras,
        cpu_adapters=resident_count(beat, AdapterTier.CPU),
        max_cpu_loras=beat.max_cpu_loras,
        disk_adapters=resident_count(beat, AdapterTier.DISK),
        generated_tokens=beat.generated_tokens,
        tok_s=pair.rate(lambda b: b.generated_tokens),
        batch_running=beat.batch_running,
        batch_limit=beat.batch_limit,
        tier_hits=hits,
        hit_rates={tier: n / total for tier, n in hits.items()} if total else {},
        placement_owned=beat.placement_owned,
        placement_resident=beat.placement_resident,
        placement_backlog=beat.placement_backlog,
        passed_on=beat.bound_passed_on,
    )


def pool_rows(workers: Iterable[WorkerRow]) -> list[PoolRow]:
    by_pool: dict[str, list[WorkerRow]] = {}
    for row in workers:
        by_pool.setdefault(row.pool, []).append(row)
    rows = []
    for pool, members in sorted(by_pool.items()):
        rates = [w.tok_s for w in members if w.tok_s is not None]
        rows.append(
            PoolRow(
                pool,
                len(members),
                sum(w.in_flight for w in members),
                sum(w.capacity for w in members),
                sum(w.queued for w in members),
                sum(rates) if rates else None,
            )
        )
    return rows


def hottest_adapters(pairs: Iterable[BeatPair], limit: int, names: Mapping[str, str] | None = None) -> list[AdapterRow]:
    """The adapters the workers count most requests for per second (then most requests), with where
    each is resident. A worker counts an adapter's rate only when both of its beats name it: one that
    just entered a worker's hottest list has no earlier count to subtract."""
    pairs = list(pairs)
    requests: dict[str, int] = {}
    rates: dict[str, float] = {}
    for pair in pairs:
        for digest, count in pair.newer.adapter_requests.items():
            requests[digest] = requests.get(digest, 0) + count
            if pair.older is not None and digest in pair.older.adapter_requests:
                rate = pair.rate(lambda b, d=digest: b.adapter_requests[d])
                if rate is not None:
                    rates[digest] = rates.get(digest, 0.0) + rate
    ranked = sorted(requests, key=lambda d: (-rates.get(d, 0.0), -requests[d], d))[:limit]
    beats = [pair.newer for pair in pairs]
    names = names or {}
    return [AdapterRow(d, rates.get(d), requests[d], tuple(placements(beats, d)), names.get(d)) for d in ranked]


def tenant_rows(window: TenantWindow, status_rates: Mapping[str, Mapping[str, float]]) -> list[TenantRow]:
    """Per tenant: admitted req/s and in flight from the limit reports, req/s per HTTP status from metrics."""
    names = set(window.requests) | set(window.in_flight) | set(status_rates)
    reported = bool(window.gateways) and window.window_s > 0
    rows = []
    for tenant in names:
        req_s = window.requests.get(tenant, 0) / window.window_s if reported else None
        rows.append(TenantRow(tenant, req_s, window.in_flight.get(tenant, 0), dict(status_rates.get(tenant, {}))))
    return sorted(rows, key=lambda r: (-(r.req_s or 0.0), -r.in_flight, r.tenant))


def build_snapshot(
    *,
    now: float,
    nats_url: str,
    pairs: Mapping[str, BeatPair],
    tenants: TenantWindow,
    streams: Iterable[StreamDepth] = (),
    status_rates: Mapping[str, Mapping[str, float]] | None = None,
    hottest: int = 10,
    names: Mapping[str, str] | None = None,
    notes: Iterable[str] = (),
) -> FleetSnapshot:
    workers = sorted((worker_row(pair, now) for pair in pairs.values()), key=lambda w: (w.pool, w.worker_id))
    return FleetSnapshot(
        taken_at=now,
        nats_url=nats_url,
        workers=tuple(workers),
        pools=tuple(pool_rows(workers)),
        adapters=tuple(hottest_adapters(pairs.values(), hottest, names)),
        tenants=tuple(tenant_rows(tenants, status_rates or {})),
        gateways=tenants.gateways,
        streams=tuple(streams),
        window_s=tenants.window_s,
        notes=tuple(notes),
    )
