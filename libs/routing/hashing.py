"""A consistent-hash ring over worker ids, with virtual nodes and a stable hash.

The hash must give the same answer in every process and on every run (the gateway replicas and the
simulator must agree on where an adapter lives), so it is blake2b of the UTF-8 key, never Python's
`hash()`, which is salted per process.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Iterable

DEFAULT_VNODES = 160
# Preference lists are cached per adapter id; the cap keeps a gateway that sees arbitrary ids bounded.
_PREFERENCE_CACHE_LIMIT = 65_536


def stable_hash64(key: str) -> int:
    """A 64-bit hash of `key` that is identical across processes, machines and Python versions."""
    return int.from_bytes(hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest(), "big")


class HashRing:
    """Workers placed on a 64-bit ring at `vnodes` points each; a key belongs to the next point clockwise.

    `preference_list(key)` is the order in which distinct workers are met walking clockwise from the
    key's position: element 0 is the key's primary, the rest are its successors (the spill order).
    """

    def __init__(self, workers: Iterable[str] = (), vnodes: int = DEFAULT_VNODES) -> None:
        if vnodes < 1:
            raise ValueError("vnodes must be >= 1")
        self.vnodes = vnodes
        self._points: list[int] = []
        self._owners: list[str] = []
        self._workers: tuple[str, ...] = ()
        self._preferences: dict[str, tuple[str, ...]] = {}
        self.set_workers(workers)

    @property
    def workers(self) -> tuple[str, ...]:
        return self._workers

    def __len__(self) -> int:
        return len(self._workers)

    def set_workers(self, workers: Iterable[str]) -> None:
        """Replace the membership. Keys owned by unchanged workers keep their owner (that is the point)."""
        unique = tuple(sorted(set(workers)))
        if any(not w for w in unique):
            raise ValueError("worker ids must be non-empty strings")
        # Points are sorted by (hash, worker) so that a hash collision still yields one fixed order.
        placed = sorted(
            (stable_hash64(f"{worker}#{replica}"), worker) for worker in unique for replica in range(self.vnodes)
        )
        self._points = [point for point, _ in placed]
        self._owners = [worker for _, worker in placed]
        self._workers = unique
        self._preferences = {}

    def primary(self, key: str) -> str:
        return self.preference_list(key)[0]

    def preference_list(self, key: str) -> tuple[str, ...]:
        """All workers in clockwise order from `key`'s position (cached; the ring is immutable between
        membership changes)."""
        cached = self._preferences.get(key)
        if cached is not None:
            return cached
        if not self._workers:
            raise LookupError("the hash ring has no workers")
        order = self._walk(stable_hash64(key))
        if len(self._preferences) >= _PREFERENCE_CACHE_LIMIT:
            self._preferences.clear()
        self._preferences[key] = order
        return order

    def _walk(self, position: int) -> tuple[str, ...]:
        start = bisect.bisect_right(self._points, position)
        count = len(self._points)
        seen: dict[str, None] = {}
        wanted = len(self._workers)
        for step in range(count):
            owner = self._owners[(start + step) % count]
            if owner not in seen:
                seen[owner] = None
                if len(seen) == wanted:
                    break
        return tuple(seen)
