"""Every active adapter version, kept in `subjects.ACTIVE_ADAPTERS_BUCKET` for the workers' placement.

The workers rank their ring share by the gateways' demand counts, but a count exists only once a version
was requested: the first request for each of a tenant's long tail of adapters would wait on the object
store. With this set a worker also places the active versions nobody asked for yet (after the requested
ones), so a first request finds its adapter on its owner's disk.

PostgreSQL is the truth; the bucket follows it: every `active_set_every_s`, and at once after a change
(woken with the outbox relay), the registry writes the versions that became active and deletes those
that stopped being active. At start it reads what the bucket holds, so a version retired while no
registry ran is deleted too. Best effort: a failed round (database or broker away) is one log line and
the next round catches up; placement only gets better with it, nothing waits on it.
"""

from __future__ import annotations

import asyncio
import logging

from nats.js.api import KeyValueConfig, StorageType
from nats.js.errors import KeyNotFoundError
from sqlmodel import select

from libs.bus.state import ConnectionState
from libs.contracts import AdapterRef, subjects
from libs.eventloop import end_if_cancelling
from services.registry.models import AdapterVersion, VersionStatus

log = logging.getLogger(__name__)


def active_set_bucket_config() -> KeyValueConfig:
    return KeyValueConfig(
        bucket=subjects.ACTIVE_ADAPTERS_BUCKET,
        history=1,
        storage=StorageType.FILE,
        description="registry: every active adapter version (what the workers place before it is requested)",
    )


async def active_refs(sessions) -> dict[str, str]:
    """digest -> the AdapterRef JSON of every active version (one per content: tenants may share one)."""
    columns = (
        AdapterVersion.digest,
        AdapterVersion.object_key,
        AdapterVersion.base_model,
        AdapterVersion.rank,
        AdapterVersion.size_bytes,
    )
    async with sessions() as session:
        rows = (await session.exec(select(*columns).where(AdapterVersion.status == VersionStatus.ACTIVE))).all()
    refs = {}
    for digest, object_key, base_model, rank, size_bytes in rows:
        ref = AdapterRef(digest=digest, object_key=object_key, base_model=base_model, rank=rank, size_bytes=size_bytes)
        refs[digest] = ref.model_dump_json()
    return refs


class ActiveSetPublisher:
    def __init__(self, sessions, link, every_s: float = 30.0) -> None:
        self.sessions = sessions
        self.link = link  # libs.bus.link.BrokerLink: its `js` follows reconnects
        self.every_s = every_s
        self.state = ConnectionState("active adapter set (PostgreSQL or NATS)")
        self._written: dict[str, str] | None = None  # what the bucket holds, as far as this registry knows
        self._wake = asyncio.Event()
        self.round_timeout_s = max(15.0, every_s)  # a round done in part keeps its writes: the next one goes on
        # Completed and failed rounds: what a test or an operator asks when the set lags behind the database.
        self.rounds = 0
        self.failures = 0

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        while True:
            # A cancel that Python 3.11's wait_for swallowed: the registry is stopping and awaits this task.
            end_if_cancelling()
            # Cleared before the database is read, not after: a commit while this round reads or writes
            # wakes the next round at once instead of waiting `every_s` (a CI run's activation waited 30 s).
            self._wake.clear()
            try:
                # Bounded: a round that hangs (a request nats-py never answers across a reconnect) is a failed
                # round the next one retries, not a publisher that silently stops.
                async with asyncio.timeout(self.round_timeout_s):
                    put, deleted = await self.sync_once()
                if put or deleted:
                    log.info("active adapter set: %d written, %d deleted", put, deleted)
                self.state.ok()
                self.rounds += 1
            except asyncio.CancelledError as exc:
                if asyncio.current_task().cancelling():
                    raise  # the registry stops
                # A request future nats-py cancelled when its connection went: a failed round, not our end.
                self._round_failed(exc)
            except Exception as exc:
                self._round_failed(exc)
            end_if_cancelling()  # before the wait, not after it: a stopping registry waits for this task
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=self.every_s)
            except TimeoutError:
                pass

    def _round_failed(self, exc: BaseException) -> None:
        self._written = None  # read the bucket again: a restarted broker may have lost writes
        self.failures += 1
        self.state.failed(exc)

    async def sync_once(self) -> tuple[int, int]:
        """Bring the bucket to the database's active versions; returns (written, deleted)."""
        refs = await active_refs(self.sessions)
        kv = await self.link.js.key_value(subjects.ACTIVE_ADAPTERS_BUCKET)
        if self._written is None:
            self._written = await bucket_contents(self.link.js, kv)
        put = deleted = 0
        for digest, ref in refs.items():
            if self._written.get(digest) != ref:
                await kv.put(digest, ref.encode())
                self._written[digest] = ref
                put += 1
        for digest in [d for d in self._written if d not in refs]:
            await kv.delete(digest)
            del self._written[digest]
            deleted += 1
        return put, deleted


async def bucket_contents(js, kv) -> dict[str, str]:
    """key -> value of every key the bucket holds: its subjects from the stream's per-subject counts, then one
    get per key. Not `kv.watchall()` until its "no more" marker: nats-py sends that marker when a
    consumer_info says nothing is pending and no message has arrived yet, which can happen before the
    consumer's first messages reach the client; the registry then read an empty bucket, never deleted
    what the bucket held, and logged nothing (a CI run's stray value stayed for 45 s)."""
    prefix = f"$KV.{subjects.ACTIVE_ADAPTERS_BUCKET}."
    info = await js.stream_info(f"KV_{subjects.ACTIVE_ADAPTERS_BUCKET}", subjects_filter=f"{prefix}>")
    contents: dict[str, str] = {}
    for subject in info.state.subjects or {}:
        key = subject.removeprefix(prefix)
        try:
            entry = await kv.get(key)
        except KeyNotFoundError:  # its last message is a delete (KeyDeletedError is one too)
            continue
        contents[key] = entry.value.decode()
    return contents
