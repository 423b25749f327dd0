"""Seeded request streams: Poisson arrivals, Zipf adapter popularity."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from libs.simulator.zipf import popularity, solve_zipf_exponent


def adapter_name(rank: int) -> str:
    """Adapter ids as the router sees them; rank 0 is the most popular."""
    return f"adapter-{rank:05d}"


@dataclass(frozen=True)
class Traffic:
    arrival_s: list[float]
    adapter_rank: list[int]
    zipf_exponent: float
    horizon_s: float

    def __len__(self) -> int:
        return len(self.arrival_s)


def make_traffic(
    adapters: int, top_k: int, top_share: float, requests_per_s: float, horizon_s: float, seed: int
) -> Traffic:
    """All arrivals in [0, horizon_s). The same seed gives the same stream, so every policy sees the same
    requests (common random numbers make the comparison fair)."""
    rng = np.random.default_rng(seed)
    exponent = solve_zipf_exponent(adapters, top_k, top_share)
    expected = requests_per_s * horizon_s
    # Draw a few standard deviations more gaps than needed, then cut at the horizon.
    gaps = rng.exponential(1.0 / requests_per_s, size=int(expected + 6 * expected**0.5 + 16))
    times = np.cumsum(gaps)
    times = times[times < horizon_s]
    cdf = np.cumsum(popularity(adapters, exponent))
    ranks = np.searchsorted(cdf, rng.random(times.size) * cdf[-1], side="right")
    ranks = np.minimum(ranks, adapters - 1)
    return Traffic(times.tolist(), ranks.tolist(), exponent, horizon_s)
