"""bench_fleet's analysis of one run: what the measured requests say (loads per 1k requests by tier, slot
hits, latency, errors) and each worker's in-flight load at every assignment, reconstructed from the
requests' own stamps, with every bound violation kept and explained."""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass

from libs.contracts import AdapterTier, InferenceResult
from libs.routing import load_bound


@dataclass
class Sample:
    alias: str
    measured: bool
    result: InferenceResult | None = None
    latency_s: float = 0.0
    rid: str = ""


def assignment_loads(samples: list[Sample], workers: int, c: float, *, at_worker: bool = False) -> dict:
    """Each worker's in-flight load at every measured assignment, from the requests' own stamps:
    assigned at the gateway (fetched_at - queue_s), or (`at_worker`) when the worker that ran it took it
    (fetched_at); done when the worker published the result."""

    def assigned(t) -> float:
        return t.fetched_at if at_worker else t.fetched_at - t.queue_s

    spans = defaultdict(list)  # worker -> [(assigned, done)]
    for s in samples:
        t = s.result.timings
        if s.result.ok and t.fetched_at and t.result_sent_at:
            spans[s.result.worker_id].append((assigned(t), t.result_sent_at))
    every = [(a, d) for lst in spans.values() for a, d in lst]
    ratios, violations, assignments = [], [], 0
    for s in samples:
        t = s.result.timings
        if not (s.measured and s.result.ok and t.fetched_at):
            continue
        at = assigned(t)
        mine = sum(1 for a, d in spans[s.result.worker_id] if a < at < d)
        total = sum(1 for a, d in every if a < at < d)
        after = mine + 1
        if after > load_bound(total, workers, c):
            violations.append(_violation(s.result.worker_id, at, after, total, workers, c, spans))
        ratios.append(after * workers / (total + 1))
        assignments += 1
    return {
        "assignments": assignments,
        "bound_violations": len(violations),
        "bound_violation_details": violations,
        "assigned_load_ratio_max": max(ratios, default=0.0),
        "assigned_load_ratio_p99": _pct(ratios, 99),
    }


def _violation(worker: str, at: float, after: int, total: int, workers: int, c: float, spans: dict) -> dict:
    """One assignment over the bound, with what explains it: how long before it another worker's request
    ended (the taker counts that worker's load as last reported) and the bound had one more been in flight."""
    others_ended = [d for w, lst in spans.items() if w != worker for _, d in lst if d <= at]
    return {
        "worker": worker,
        "at": at,
        "load_after": after,
        "pool_in_flight": total,
        "bound": load_bound(total, workers, c),
        "bound_one_more_in_flight": load_bound(total + 1, workers, c),
        "ms_since_another_worker_answered": round((at - max(others_ended)) * 1000, 1) if others_ended else None,
    }


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(math.ceil(q / 100 * len(ordered))) - 1)]


def summarise(samples: list[Sample], workers: int, c: float) -> dict:
    measured = [s for s in samples if s.measured]
    n = len(measured)
    tiers = [s.result.adapter_tier for s in measured if s.result.ok]
    per_1k = 1000.0 / n if n else 0.0
    cold = sum(t in (AdapterTier.DISK, AdapterTier.OBJECT_STORE) for t in tiers)
    from_s3 = sum(t == AdapterTier.OBJECT_STORE for t in tiers)
    host = sum(t == AdapterTier.CPU for t in tiers)
    latencies = [s.latency_s for s in measured if s.result.ok]
    return {
        "requests": n,
        "errors": sum(not s.result.ok for s in measured),
        "error_reasons": error_reasons(measured),
        "loads_per_1000": (cold + host) * per_1k,
        "cold_loads_per_1000": cold * per_1k,
        "object_fetches_per_1000": from_s3 * per_1k,
        "slot_hit_rate": sum(t == AdapterTier.GPU for t in tiers) / n if n else 0.0,
        "latency_p50_s": statistics.median(latencies) if latencies else 0.0,
        "latency_p99_s": _pct(latencies, 99),
        **assignment_loads(samples, workers, c),
        **_at_worker(assignment_loads(samples, workers, c, at_worker=True)),
    }


def _at_worker(loads: dict) -> dict:
    return {
        "bound_violations_at_worker": loads["bound_violations"],
        "bound_violation_details_at_worker": loads["bound_violation_details"],
    }


def error_reasons(samples: list[Sample], top: int = 5) -> dict[str, int]:
    """The most frequent errors answered, by code and message (a benchmark's errors must be explainable)."""
    reasons = Counter(
        f"{s.result.error.code}: {s.result.error.message[:120]}" if s.result.error else "no error info"
        for s in samples
        if not s.result.ok
    )
    return dict(reasons.most_common(top))
