"""Which adapters this worker serves most right now, for the "hottest adapters" dashboard panel.

One Prometheus series per adapter would be one per adapter the worker ever served (thousands); the
worker exports only its `top` hottest instead. Hot means recent: each adapter's use is an exponentially
decayed count (half-life `half_life_s`), so an adapter busy yesterday drops out of the top and one busy
now enters it. The exported value is the plain count since start, a Prometheus counter, so
`rate()` over it gives the request rate of the adapters in the top.
Memory: one small entry per adapter the worker has served since it started.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class _Use:
    count: int = 0
    score: float = 0.0
    at: float = 0.0


class AdapterHotness:
    def __init__(self, half_life_s: float = 300.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._decay = math.log(2) / half_life_s
        self._clock = clock
        self._uses: dict[str, _Use] = {}

    def used(self, digest: str) -> None:
        now = self._clock()
        use = self._uses.setdefault(digest, _Use(at=now))
        use.score = self._score(use, now) + 1.0
        use.at = now
        use.count += 1

    def top(self, n: int) -> list[tuple[str, int]]:
        """The `n` hottest adapters now, hottest first, each with its request count since start."""
        now = self._clock()
        ranked = sorted(self._uses.items(), key=lambda item: (-self._score(item[1], now), item[0]))
        return [(digest, use.count) for digest, use in ranked[:n]]

    def _score(self, use: _Use, now: float) -> float:
        return use.score * math.exp(-self._decay * (now - use.at))
