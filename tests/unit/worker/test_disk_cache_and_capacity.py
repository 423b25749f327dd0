"""Worker mechanisms with a fake object store: single-flight downloads, LRU by bytes, pins, capacity."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from libs.contracts import AdapterRef
from libs.lora.format import ADAPTER_FILES, digest_of_files, file_sha256
from libs.objectstore import DigestMismatch
from services.worker.bounded_take import Capacity
from services.worker.disk_cache import DiskCache


def _adapter_files(root: Path, seed: int, size: int = 1000) -> tuple[Path, str]:
    src = root / f"src-{seed}"
    src.mkdir(parents=True)
    (src / ADAPTER_FILES[0]).write_text(f'{{"r": 16, "seed": {seed}}}')
    (src / ADAPTER_FILES[1]).write_bytes(bytes([seed % 256]) * size)
    return src, digest_of_files({n: file_sha256(src / n) for n in ADAPTER_FILES})


class FakeStore:
    """Copies from local source dirs, counting downloads; can corrupt or block on demand."""

    def __init__(self, sources: dict[str, Path]) -> None:
        self.sources = sources
        self.downloads: dict[str, int] = {}
        self.corrupt: set[str] = set()
        self.gate = threading.Event()
        self.gate.set()
        self.lock = threading.Lock()

    def get_adapter(self, digest: str, prefix: str, dest: Path) -> Path:
        self.gate.wait(5)
        with self.lock:
            self.downloads[digest] = self.downloads.get(digest, 0) + 1
        if digest in self.corrupt:
            raise DigestMismatch(f"adapter {digest[:12]}: stored files hash to something else")
        dest.mkdir(parents=True)
        for name in ADAPTER_FILES:
            (dest / name).write_bytes((self.sources[digest] / name).read_bytes())
        return dest


def _ref(digest: str) -> AdapterRef:
    return AdapterRef(digest=digest, object_key=f"adapters/sha256/{digest}/", base_model="b", rank=16)


@pytest.fixture
def setup(tmp_path):
    made = [_adapter_files(tmp_path, i) for i in range(3)]
    store = FakeStore({d: p for p, d in made})
    return tmp_path, store, [d for _, d in made]


async def test_concurrent_requests_for_one_digest_download_once(setup):
    tmp, store, digests = setup
    cache = DiskCache(tmp / "cache", 10_000, store)
    store.gate.clear()
    waiters = [asyncio.create_task(cache.get(_ref(digests[0]))) for _ in range(5)]
    await asyncio.sleep(0.1)
    store.gate.set()
    results = await asyncio.gather(*waiters)
    assert store.downloads[digests[0]] == 1
    assert sum(1 for _, was_cached in results if was_cached) == 0 and cache.stats.misses == 1
    assert (await cache.get(_ref(digests[0])))[1] is True  # now a disk hit


async def test_lru_eviction_by_bytes_spares_pinned_entries(setup):
    tmp, store, digests = setup
    cache = DiskCache(tmp / "cache", 2_200, store)  # room for two ~1 KB adapters
    for d in digests[:2]:
        await cache.get(_ref(d))
    cache.pin(digests[0])
    await cache.get(_ref(digests[2]))  # must evict: digests[1] (unpinned), not digests[0]
    assert cache.contains(digests[0]) and not cache.contains(digests[1]) and cache.contains(digests[2])
    assert not (tmp / "cache" / digests[1]).exists()
    assert cache.stats.evictions == 1 and cache.stats.bytes <= 2_200


async def test_failed_download_leaves_nothing_and_every_waiter_sees_the_error(setup):
    tmp, store, digests = setup
    cache = DiskCache(tmp / "cache", 10_000, store)
    store.corrupt.add(digests[1])
    store.gate.clear()
    waiters = [asyncio.create_task(cache.get(_ref(digests[1]))) for _ in range(3)]
    await asyncio.sleep(0.05)
    store.gate.set()
    outcomes = await asyncio.gather(*waiters, return_exceptions=True)
    assert all(isinstance(o, DigestMismatch) for o in outcomes)
    assert not cache.contains(digests[1]) and not (tmp / "cache" / digests[1]).exists()


async def test_restart_adopts_verified_entries_and_drops_tampered_ones(setup):
    tmp, store, digests = setup
    cache = DiskCache(tmp / "cache", 10_000, store)
    for d in digests[:2]:
        await cache.get(_ref(d))
    (tmp / "cache" / digests[1] / ADAPTER_FILES[1]).write_bytes(b"tampered")
    (tmp / "cache" / ".partial-download").mkdir()
    again = DiskCache(tmp / "cache", 10_000, store)
    assert again.contains(digests[0]) and not again.contains(digests[1])
    assert not (tmp / "cache" / ".partial-download").exists()


async def test_capacity_lets_a_waiting_loop_in_as_soon_as_room_frees():
    cap = Capacity(2)
    cap.take(2)
    waiter = asyncio.create_task(cap.wait_for_room())
    await asyncio.sleep(0.01)
    assert not waiter.done()
    await cap.give_back(1)
    assert await asyncio.wait_for(waiter, 1) == 1
