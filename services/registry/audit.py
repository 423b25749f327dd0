"""The audit trail: every change of state is one row of `audit_log`, written in the transaction that
makes the change (so an entry exists if and only if the change was committed).

Who acted and under which request id are set once per request (the credential check and the request
id middleware, services/registry/routes/deps.py and api.py) in context variables, so the code that
changes state records an entry without the caller's identity being handed down every call. Work the
registry does on its own (the eval gate's verdicts, read from NATS) names itself with `acting`.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from services.registry.access_models import AuditEntry, AuditPublic

MAX_LIMIT = 1000
SERVICE = "service"  # the scope of the registry's own consumers


@dataclass(frozen=True)
class Actor:
    name: str  # the credential's name, never its secret
    scope: str  # admin, maintainer or service


UNKNOWN = Actor("registry", SERVICE)
_actor: contextvars.ContextVar[Actor] = contextvars.ContextVar("lpx_registry_actor", default=UNKNOWN)
_request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("lpx_registry_request_id", default=None)


def set_actor(actor: Actor) -> None:
    _actor.set(actor)


def set_request_id(request_id: str | None) -> None:
    _request_id.set(request_id)


def current_actor() -> Actor:
    return _actor.get()


@contextmanager
def acting(actor: Actor, request_id: str | None = None) -> Iterator[None]:
    """Record what happens inside as done by `actor` (the registry's consumers of NATS messages)."""
    actor_token, request_token = _actor.set(actor), _request_id.set(request_id)
    try:
        yield
    finally:
        _actor.reset(actor_token)
        _request_id.reset(request_token)


def record(
    session: AsyncSession,
    action: str,
    target: str,
    *,
    tenant: str | None = None,
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
) -> None:
    """Add one entry to the caller's transaction (flushed with it)."""
    actor = _actor.get()
    session.add(
        AuditEntry(
            actor=actor.name,
            scope=actor.scope,
            tenant=tenant,
            action=action,
            target=target,
            before=_jsonable(before),
            after=_jsonable(after),
            request_id=_request_id.get(),
        )
    )


async def entries(
    session: AsyncSession, *, tenant: str | None = None, since: datetime | None = None, limit: int = 100
) -> list[AuditPublic]:
    """The newest `limit` entries (of `tenant`, from `since` on), oldest first."""
    query = select(AuditEntry)
    if tenant is not None:
        query = query.where(AuditEntry.tenant == tenant)
    if since is not None:
        query = query.where(col(AuditEntry.at) >= since)
    rows = (await session.exec(query.order_by(col(AuditEntry.id).desc()).limit(min(limit, MAX_LIMIT)))).all()
    return [AuditPublic.model_validate(row, from_attributes=True) for row in reversed(rows)]


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return str(value)
