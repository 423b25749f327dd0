"""The worker's local disk tier: adapter directories named by digest, LRU-bounded in bytes.

One download per digest however many requests wait for it (single flight); the digest is verified
after every download (ObjectStore.get_adapter); entries in use by a loading request are never evicted.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from libs.contracts import AdapterRef
from libs.lora.format import ADAPTER_FILES, adapter_digest
from libs.objectstore import ObjectStore

log = logging.getLogger(__name__)


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    downloads: int = 0
    bytes: int = 0


class DiskCache:
    def __init__(self, root: Path, max_bytes: int, store: ObjectStore) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self.store = store
        self.stats = CacheStats()
        self._entries: OrderedDict[str, int] = OrderedDict()  # digest -> bytes, least recent first
        self._inflight: dict[str, asyncio.Future] = {}
        self._pins: dict[str, int] = {}
        self.root.mkdir(parents=True, exist_ok=True)
        self._scan()

    def _scan(self) -> None:
        """Adopt what an earlier run left (verified, oldest first); drop partial or foreign dirs."""
        found = []
        for path in self.root.iterdir():
            if path.name.startswith("."):
                shutil.rmtree(path, ignore_errors=True)  # an interrupted download
                continue
            try:
                if adapter_digest(path) != path.name:
                    raise ValueError("digest mismatch")
            except (OSError, ValueError):
                log.warning("dropping unverifiable cache entry %s", path.name)
                shutil.rmtree(path, ignore_errors=True)
                continue
            found.append((path.stat().st_mtime, path.name, _dir_bytes(path)))
        for _, digest, size in sorted(found):
            self._entries[digest] = size
        self.stats.bytes = sum(self._entries.values())

    def path(self, digest: str) -> Path:
        return self.root / digest

    def contains(self, digest: str) -> bool:
        return digest in self._entries

    def digests(self) -> list[str]:
        return list(reversed(self._entries))  # most recent first

    async def get(self, ref: AdapterRef) -> tuple[Path, bool]:
        """The adapter's local directory and whether it was already on disk (True) or downloaded."""
        if ref.digest in self._entries:
            self._entries.move_to_end(ref.digest)
            self.path(ref.digest).touch()
            self.stats.hits += 1
            return self.path(ref.digest), True
        waiting = self._inflight.get(ref.digest)
        if waiting is not None:
            await asyncio.shield(waiting)
            return self.path(ref.digest), False
        self.stats.misses += 1
        future = asyncio.get_running_loop().create_future()
        self._inflight[ref.digest] = future
        try:
            await asyncio.to_thread(self.store.get_adapter, ref.digest, ref.object_key, self.path(ref.digest))
            self.stats.downloads += 1
            self._admit(ref.digest)
            future.set_result(None)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # mark retrieved: waiters re-raise it themselves
            raise
        finally:
            del self._inflight[ref.digest]
        return self.path(ref.digest), False

    def pin(self, digest: str) -> None:
        self._pins[digest] = self._pins.get(digest, 0) + 1

    def unpin(self, digest: str) -> None:
        left = self._pins.get(digest, 0) - 1
        if left > 0:
            self._pins[digest] = left
        else:
            self._pins.pop(digest, None)
        self._evict()

    def _admit(self, digest: str) -> None:
        self._entries[digest] = _dir_bytes(self.path(digest))
        self._entries.move_to_end(digest)
        self._evict(keep=digest)

    def _evict(self, keep: str | None = None) -> None:
        total = sum(self._entries.values())
        for digest in list(self._entries):
            if total <= self.max_bytes:
                break
            if digest == keep or digest in self._pins:
                continue
            total -= self._entries.pop(digest)
            shutil.rmtree(self.path(digest), ignore_errors=True)
            self.stats.evictions += 1
            log.info("evicted adapter %s from disk cache", digest[:12])
        self.stats.bytes = total


def _dir_bytes(path: Path) -> int:
    return sum((path / name).stat().st_size for name in ADAPTER_FILES if (path / name).exists())
