"""Zipf popularity over N adapters, with the exponent solved from "the top K carry P of requests".

Pure Python (no numpy) so the planner can use it without the simulation extra.
"""

from __future__ import annotations

import math


def zipf_weights(n: int, exponent: float) -> list[float]:
    """Unnormalised weights 1 / rank^s for ranks 1..n."""
    return [rank**-exponent for rank in range(1, n + 1)]


def top_share(n: int, k: int, exponent: float) -> float:
    """Fraction of requests that go to the k most popular of n adapters."""
    weights = zipf_weights(n, exponent)
    return math.fsum(weights[:k]) / math.fsum(weights)


def solve_zipf_exponent(n: int, k: int, share: float, tolerance: float = 1e-9) -> float:
    """The exponent s for which the top `k` of `n` adapters carry `share` of the traffic.

    top_share is increasing in s (s = 0 is uniform, k / n; s -> inf puts everything on rank 1), so
    bisection converges.
    """
    if not 0 < k < n:
        raise ValueError("need 0 < k < n")
    uniform = k / n
    if not uniform < share < 1:
        raise ValueError(f"share must lie in ({uniform:.4g}, 1): a uniform spread already gives {uniform:.4g}")
    low, high = 0.0, 1.0
    while top_share(n, k, high) < share:
        high *= 2
    while high - low > tolerance:
        middle = (low + high) / 2
        if top_share(n, k, middle) < share:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def popularity(n: int, exponent: float) -> list[float]:
    """Normalised request share per adapter rank (rank 1 first)."""
    weights = zipf_weights(n, exponent)
    total = math.fsum(weights)
    return [w / total for w in weights]
