"""What request handlers and background tasks share: settings, database, object store, the relay's
wake-up, and fault-injection seams for crash tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from libs.objectstore import ObjectStore
from services.registry.db import Sessions
from services.registry.deadlines import Expired
from services.registry.settings import RegistrySettings


@dataclass
class FaultHooks:
    """Called at the points where a crash hurts most; None in production. Tests use them to kill
    PostgreSQL between the upload and the commit."""

    after_upload: Callable[[], None] | None = None
    before_commit: Callable[[], None] | None = None

    def fire(self, name: str) -> None:
        hook = getattr(self, name)
        if hook is not None:
            hook()


@dataclass
class RegistryContext:
    settings: RegistrySettings
    engine: AsyncEngine
    sessions: Sessions
    store: ObjectStore
    wake_relay: Callable[[], None] = lambda: None
    hooks: FaultHooks = field(default_factory=FaultHooks)
    # Tenants' NATS connections (services/registry/nats_access.py); None until the broker is up.
    nats_access: Any = None
    # Requests left unanswered: past their asker's deadline, or their connection lost (registry/deadlines.py).
    expired: Expired = field(default_factory=Expired)
    # The broker link (libs.bus), set once the broker is up: responders check their connection with it.
    link: Any = None


def lock_key(digest: str) -> int:
    """A signed 64-bit advisory-lock key from a content digest."""
    return int.from_bytes(bytes.fromhex(digest[:16]), "big", signed=True)


@asynccontextmanager
async def digest_lock(engine: AsyncEngine, digest: str) -> AsyncIterator[AsyncConnection]:
    """Serialise everything that uploads or deletes the object of `digest`, across replicas.

    A session-level advisory lock on a dedicated connection (not a transaction lock: it must span the
    upload, which happens outside any transaction). It dies with the connection, so a caller that
    wants to delete an object checks on this same connection that the lock is still held.
    """
    async with engine.connect() as conn:
        await conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": lock_key(digest)})
        await conn.commit()
        try:
            yield conn
        finally:
            try:
                await conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": lock_key(digest)})
                await conn.commit()
            except Exception:
                await conn.invalidate()
