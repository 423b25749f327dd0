"""The worker's copy of the registry's active adapter set: a whole snapshot is adopted only once read to
its end, then changes (puts, deletes) follow; a value that is not an AdapterRef is skipped."""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass

import nats.errors

from libs.contracts import AdapterRef
from services.worker.active_set import ActiveSet


def ref(i: int) -> AdapterRef:
    digest = hashlib.sha256(f"a{i}".encode()).hexdigest()
    return AdapterRef(digest=digest, object_key=f"adapters/{digest}/", base_model="b", rank=8, size_bytes=10)


@dataclass
class Entry:
    key: str
    value: bytes
    operation: str | None = None


def put(r: AdapterRef) -> Entry:
    return Entry(r.digest, r.model_dump_json().encode())


class Watcher:
    def __init__(self, script: list) -> None:
        self.script = script
        self.stopped = False

    async def updates(self, timeout: float):
        if not self.script:
            await asyncio.sleep(min(timeout, 0.01))
            raise nats.errors.TimeoutError
        step = self.script.pop(0)
        if callable(step):
            step()
            return await self.updates(timeout)
        return step

    async def stop(self) -> None:
        self.stopped = True


class JS:
    def __init__(self, watcher: Watcher) -> None:
        self.watcher = watcher

    async def key_value(self, bucket: str):
        js = self

        class KV:
            async def watchall(self):
                return js.watcher

        return KV()


async def test_a_snapshot_is_adopted_whole_then_changes_follow():
    seen_during_snapshot = []
    active = None

    def look() -> None:
        seen_during_snapshot.append(dict(active.refs))

    watcher = Watcher(
        [
            put(ref(1)),
            put(ref(2)),
            look,  # half-way through the snapshot: nothing adopted yet
            Entry("bogus", b"{not json"),
            None,  # the end of the current values
            put(ref(3)),
            Entry(ref(1).digest, b"", operation="DEL"),
        ]
    )
    active = ActiveSet(lambda: JS(watcher))
    await active._watch_for(0.3)
    assert seen_during_snapshot == [{}]
    assert active.loaded.is_set()
    assert set(active.refs) == {ref(2).digest, ref(3).digest}
    assert active.refs[ref(3).digest] == ref(3)
    assert watcher.stopped  # each watch is stopped when its refresh period ends
