"""Every active adapter version, as the registry keeps it in `subjects.ACTIVE_ADAPTERS_BUCKET`.

Placement ranks a worker's ring share by the gateways' demand counts; this adds the active versions
nobody has requested yet, placed after the requested ones, so the first request for a tail adapter finds
it on its owner's disk instead of waiting on the object store.

Watched (an ordered consumer: the bucket's current values, then every change). The watch is started
again every `refresh_s`, reading the whole set afresh, so a broker restart or a consumer lost on the way
costs one refresh at most, never a stale set for ever. Best effort: without the bucket (no registry has
run yet) placement uses the demand counts alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import nats.errors
from pydantic import ValidationError

from libs.bus.state import ConnectionState
from libs.contracts import AdapterRef, subjects

log = logging.getLogger(__name__)
_DELETED = ("DEL", "PURGE")


class ActiveSet:
    def __init__(self, js_of, refresh_s: float = 300.0, retry_s: float = 5.0) -> None:
        self._js_of = js_of  # () -> the worker's current JetStream context
        self.refresh_s = refresh_s
        self.retry_s = retry_s
        self.refs: dict[str, AdapterRef] = {}
        self.loaded = asyncio.Event()  # the first whole set has been read
        self.state = ConnectionState("active adapter set (registry's bucket)")

    async def run(self) -> None:
        while True:
            try:
                await self._watch_for(self.refresh_s)
                self.state.ok()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # no bucket yet, or the broker is away: try again shortly
                self.state.failed(exc)
                await asyncio.sleep(self.retry_s)

    async def _watch_for(self, seconds: float) -> None:
        kv = await self._js_of().key_value(subjects.ACTIVE_ADAPTERS_BUCKET)
        watcher = await kv.watchall()
        loop = asyncio.get_running_loop()
        until = loop.time() + seconds
        fresh: dict[str, AdapterRef] | None = {}  # the snapshot being read; None once it is adopted
        try:
            while (left := until - loop.time()) > 0:
                try:
                    entry = await watcher.updates(timeout=min(left, 5.0))
                except nats.errors.TimeoutError:
                    continue
                if entry is None:  # the current values are all in: adopt them, then follow changes
                    if fresh is not None:
                        self.refs, fresh = fresh, None
                        self.loaded.set()
                    continue
                _apply(self.refs if fresh is None else fresh, entry)
        finally:
            with contextlib.suppress(Exception):
                await watcher.stop()


def _apply(refs: dict[str, AdapterRef], entry) -> None:
    if entry.operation in _DELETED:
        refs.pop(entry.key, None)
        return
    try:
        refs[entry.key] = AdapterRef.model_validate_json(entry.value)
    except ValidationError:
        log.warning("active adapter set: a value under %s is not an AdapterRef; ignored", entry.key[:12])
