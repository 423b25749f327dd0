"""Turn a raw run into the figures we compare policies on."""

from __future__ import annotations

import numpy as np

from libs.simulator.engine import TIER_GPU, RunResult


def _percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else 0.0


def _replicas_per_adapter(replica_of: list[int], adapter_rank: list[int]) -> tuple[int, float]:
    """Distinct replicas that served the hottest adapter, and the traffic-weighted mean over adapters."""
    if not replica_of:
        return 0, 0.0
    ranks = np.asarray(adapter_rank, dtype=np.int64)
    pairs = np.unique(ranks * 1_000_000 + np.asarray(replica_of, dtype=np.int64))
    spread = np.bincount(pairs // 1_000_000)
    hottest = int(spread[0]) if spread.size else 0
    weighted = float(np.mean(spread[ranks]))
    return hottest, weighted


def summarise(run: RunResult) -> dict:
    per_1000 = 1000.0 / run.measured if run.measured else 0.0
    hits = sum(1 for t in run.tiers if t == TIER_GPU)
    hottest_spread, mean_spread = _replicas_per_adapter(run.replica_of, run.adapter_rank)
    samples = run.sampled_max_over_mean
    return {
        "policy": run.policy,
        "scenario": run.scenario.name,
        "requests": run.measured,
        "served_exactly_once": run.served_once,
        "host_loads_per_1000": run.host_loads * per_1000,
        "cold_loads_per_1000": run.cold_loads * per_1000,
        "loads_per_1000": (run.host_loads + run.cold_loads) * per_1000,
        "cold_loads": run.cold_loads,
        "object_fetches_per_1000": run.object_fetches * per_1000,  # cold loads not served from local disk
        "slot_hit_rate": hits / run.measured if run.measured else 0.0,
        "latency_p50_s": _percentile(run.latency_s, 50),
        "latency_p99_s": _percentile(run.latency_s, 99),
        "wait_p50_s": _percentile(run.wait_s, 50),
        "wait_p99_s": _percentile(run.wait_s, 99),
        # Peak-to-mean in-flight load across replicas, sampled every sample_interval_s: mean and worst.
        "max_over_mean_load": float(np.mean(samples)) if samples else 0.0,
        "max_over_mean_load_peak": float(np.max(samples)) if samples else 0.0,
        # The chosen replica's load / mean load at assignment (what the bound limits).
        "assigned_load_ratio_p99": _percentile(run.load_ratios, 99),
        "assigned_load_ratio_max": float(np.max(run.load_ratios)) if run.load_ratios else 0.0,
        "bound_violations": run.bound_violations,
        "max_bound_use": run.max_bound_use,
        "replicas_serving_hottest_adapter": hottest_spread,
        "replicas_per_adapter_weighted": mean_spread,
        "routing_stats": run.routing_stats,
        "placement_fetches": run.placement_fetches,
        # Requests the workers passed on over the bound (SimConfig.handoff_share), over the whole run.
        "passed_on_per_1000": run.routing_stats.get("handoffs", 0) * 1000.0 / max(1, run.requests),
        "cold_loads_per_s": run.cold_loads_per_s,
        "wall_s": run.wall_s,
    }
