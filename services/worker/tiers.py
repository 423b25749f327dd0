"""Where an adapter is, and making it usable: engine slot (GPU) > host RAM (vLLM's CPU LoRA cache)
> local disk > object store. Every step fails closed with a reason the caller can show."""

from __future__ import annotations

import json
import logging
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass

from libs.contracts import AdapterRef, AdapterTier
from libs.engine import AdapterSpec, lora_int_id
from libs.lora.format import CONFIG_FILE
from libs.objectstore import DigestMismatch, ObjectStoreError
from services.worker.disk_cache import DiskCache
from services.worker.hotness import AdapterHotness

log = logging.getLogger(__name__)


class AdapterUnavailable(Exception):
    """The adapter cannot be applied; `code` is machine-readable, the message is for people."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class AdapterLease:
    spec: AdapterSpec
    tier: AdapterTier
    load_s: float


class AdapterTiers:
    def __init__(
        self, disk: DiskCache, engine, *, base_model: str, max_rank: int, max_loras: int, max_cpu_loras: int = 16
    ) -> None:
        self.disk = disk
        self.engine = engine
        self.base_model = base_model
        self.max_rank = max_rank
        # vLLM activates adapters into `max_loras` slots per step; the most recently scheduled ones
        # are the ones resident. We mirror that LRU to report the GPU tier.
        self._slots: OrderedDict[str, None] = OrderedDict()
        self._max_loras = max_loras
        # The engine's host-RAM LoRA cache (vLLM: LRU of `max_cpu_loras`), mirrored here so that a
        # request does not ask the engine: `list_loras` is an RPC to the engine core that waits behind
        # the model step running (~100 ms under load, measured in bench_vs_vllm's stage timeline). Re-synced
        # from the engine at every heartbeat (`resident`). A wrong guess costs nothing but the tier label:
        # every request carries the adapter's path and vLLM loads it if it was evicted.
        self._in_engine: OrderedDict[str, None] = OrderedDict()
        self._max_cpu_loras = max_cpu_loras
        # Adapters that left the gpu and cpu tiers (as mirrored here; the disk tier counts its own) and
        # which adapters requests ask for: both exported by services/worker/metrics.py.
        self.evictions: Counter[AdapterTier] = Counter()
        self.hotness = AdapterHotness()

    def check_compatible(self, ref: AdapterRef) -> None:
        if ref.base_model != self.base_model:
            raise AdapterUnavailable(
                "base_mismatch",
                f"adapter {ref.digest[:12]} is for base {ref.base_model!r}; this pool serves {self.base_model!r}",
            )
        if ref.rank > self.max_rank:
            raise AdapterUnavailable(
                "rank_mismatch", f"adapter rank {ref.rank} exceeds this pool's max rank {self.max_rank}"
            )

    async def acquire(self, ref: AdapterRef, *, request: bool = True) -> AdapterLease:
        """Make `ref` usable by the engine; pin its disk copy until `release`. `request`: for a request
        (counted in the adapter's hotness), not a prewarm."""
        self.check_compatible(ref)
        if request:
            self.hotness.used(ref.digest)
        tier = await self._current_tier(ref)
        started = time.monotonic()
        self.disk.pin(ref.digest)
        try:
            path, _ = await self._fetch(ref)
            spec = AdapterSpec(ref.digest, path)
            if tier in (AdapterTier.DISK, AdapterTier.OBJECT_STORE):
                self._check_files(ref, path)
                await self._load_into_engine(spec)
        except BaseException:
            self.disk.unpin(ref.digest)
            raise
        if request:  # a prewarm loads into host RAM; the engine takes a slot only for a request
            self._touch_slot(ref.digest)
        self._touch_engine(ref.digest)
        return AdapterLease(spec, tier, time.monotonic() - started)

    def release(self, lease: AdapterLease) -> None:
        self.disk.unpin(lease.spec.digest)

    async def prewarm(self, ref: AdapterRef) -> AdapterTier:
        lease = await self.acquire(ref, request=False)
        self.release(lease)
        return lease.tier

    async def resident(self) -> dict[AdapterTier, list[str]]:
        loaded = await self.engine.loaded_adapters()
        in_engine = [d for d in self.disk.digests() if lora_int_id(d) in loaded]
        for digest in [d for d in self._in_engine if lora_int_id(d) not in loaded]:
            del self._in_engine[digest]  # evicted by the engine since: the mirror follows the truth
            self.evictions[AdapterTier.CPU] += 1
        slots = [d for d in reversed(self._slots) if d in in_engine]
        return {
            AdapterTier.GPU: slots,
            AdapterTier.CPU: [d for d in in_engine if d not in slots],
            AdapterTier.DISK: [d for d in self.disk.digests() if d not in in_engine],
        }

    async def _current_tier(self, ref: AdapterRef) -> AdapterTier:
        if ref.digest in self._in_engine:
            return AdapterTier.GPU if ref.digest in self._slots else AdapterTier.CPU
        return AdapterTier.DISK if self.disk.contains(ref.digest) else AdapterTier.OBJECT_STORE

    async def _fetch(self, ref: AdapterRef):
        try:
            return await self.disk.get(ref)
        except DigestMismatch as exc:
            message = f"adapter {ref.digest[:12]} failed verification: {exc}"
            raise AdapterUnavailable("digest_mismatch", message) from exc
        except ObjectStoreError as exc:
            raise AdapterUnavailable("adapter_unavailable", f"adapter {ref.digest[:12]}: {exc}") from exc
        except Exception as exc:  # network down, S3 errors, ...
            message = f"adapter {ref.digest[:12]} could not be fetched: {type(exc).__name__}: {exc}"
            raise AdapterUnavailable("adapter_unavailable", message) from exc

    def _check_files(self, ref: AdapterRef, path) -> None:
        """The bytes match the digest (verified on download); their config must match the request."""
        try:
            config = json.loads((path / CONFIG_FILE).read_text())
        except (OSError, ValueError) as exc:
            raise AdapterUnavailable("adapter_invalid", f"adapter {ref.digest[:12]}: unreadable config: {exc}") from exc
        rank = int(config.get("r", 0))
        if rank != ref.rank or rank > self.max_rank:
            raise AdapterUnavailable(
                "rank_mismatch",
                f"adapter {ref.digest[:12]} has rank {rank}; the request says "
                f"{ref.rank} and this pool allows {self.max_rank}",
            )

    async def _load_into_engine(self, spec: AdapterSpec) -> None:
        try:
            await self.engine.add_adapter(spec)
        except Exception as exc:
            raise AdapterUnavailable(
                "adapter_load_failed", f"engine could not load adapter {spec.digest[:12]}: {type(exc).__name__}: {exc}"
            ) from exc

    def _touch_engine(self, digest: str) -> None:
        self._in_engine[digest] = None
        self._in_engine.move_to_end(digest)
        while len(self._in_engine) > self._max_cpu_loras:
            self._in_engine.popitem(last=False)
            self.evictions[AdapterTier.CPU] += 1

    def _touch_slot(self, digest: str) -> None:
        self._slots[digest] = None
        self._slots.move_to_end(digest)
        while len(self._slots) > self._max_loras:
            self._slots.popitem(last=False)
            self.evictions[AdapterTier.GPU] += 1
