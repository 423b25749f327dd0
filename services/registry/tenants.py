"""Tenants, their API keys (creation, revocation) and their limits at the gateway."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy.exc import IntegrityError
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from libs.contracts import TenantEvent, TenantEventKind, TenantLimits, subjects
from services.registry import audit, keys, outbox
from services.registry.errors import Conflict, NotFound, Unauthorized
from services.registry.models import ApiKey, Tenant
from services.registry.validation import check_name


async def create_tenant(session: AsyncSession, name: str) -> tuple[Tenant, keys.NewKey]:
    """A new tenant with its first API key (the plaintext is returned once and never stored)."""
    check_name("tenant", name)
    if (await session.exec(select(Tenant.id).where(Tenant.name == name))).first() is not None:
        raise Conflict(f"tenant {name!r} already exists", code="tenant_exists")
    tenant = Tenant(name=name)
    session.add(tenant)
    try:
        await session.flush()
    except IntegrityError:
        raise Conflict(f"tenant {name!r} already exists", code="tenant_exists") from None
    audit.record(session, "tenant.created", name, tenant=name, after={"tenant": name})
    return tenant, await add_key(session, tenant)


async def add_key(session: AsyncSession, tenant: Tenant, kind: str = keys.INFERENCE) -> keys.NewKey:
    new = keys.generate(tenant.name, kind)
    session.add(ApiKey(tenant_id=tenant.id, key_id=new.key_id, key_hash=new.key_hash, kind=kind))
    await session.flush()
    audit.record(session, "key.created", new.key_id, tenant=tenant.name, after={"kind": kind})
    return new


async def list_tenants(session: AsyncSession) -> list[Tenant]:
    return list((await session.exec(select(Tenant).order_by(Tenant.name))).all())


async def authenticate(session: AsyncSession, tenant_name: str, api_key: str, kind: str = keys.INFERENCE) -> Tenant:
    """The tenant `api_key` belongs to, provided it is `tenant_name`'s live key of `kind`; Unauthorized
    otherwise (a NATS credential is never an API key, nor the reverse). Every failure gives the same
    message, so a caller learns nothing about which part was wrong."""
    return (await _live_key(session, tenant_name, api_key, kind))[1]


async def authenticate_nats(session: AsyncSession, tenant_name: str, credential: str) -> Tenant:
    """The auth callout's check of a NATS connection (user = tenant, password = credential); records
    when the credential was last used."""
    key, tenant = await _live_key(session, tenant_name, credential, keys.NATS)
    key.last_used_at = datetime.now(UTC)
    session.add(key)
    return tenant


async def _live_key(session: AsyncSession, tenant_name: str, secret: str, kind: str) -> tuple[ApiKey, Tenant]:
    what = "NATS credential" if kind == keys.NATS else "API key"
    refused = Unauthorized(f"invalid {what} for tenant {tenant_name!r}")
    parsed = keys.parse(secret)
    if parsed is None or parsed.tenant != tenant_name or parsed.kind != kind:
        raise refused
    live = (ApiKey.key_id == parsed.key_id, ApiKey.kind == kind, col(ApiKey.revoked_at).is_(None))
    query = select(ApiKey, Tenant).join(Tenant, col(ApiKey.tenant_id) == col(Tenant.id)).where(*live)
    row = (await session.exec(query)).first()
    if row is None:
        raise refused
    key, tenant = row
    if tenant.name != tenant_name or not keys.matches(parsed, key.key_hash):
        raise refused
    return key, tenant


def limits_of(tenant: Tenant) -> TenantLimits:
    return TenantLimits(
        rps=tenant.rps_limit, tpm=tenant.tpm_limit, concurrency=tenant.concurrency_limit, weight=tenant.fair_weight
    )


async def set_limits(session: AsyncSession, tenant: Tenant, limits: TenantLimits) -> Tenant:
    """Store the tenant's limits (None = the pool default) and tell every gateway (outbox, same
    transaction: the event goes out if and only if the change is committed)."""
    before = limits_of(tenant).model_dump()
    tenant.rps_limit, tenant.tpm_limit, tenant.concurrency_limit = limits.rps, limits.tpm, limits.concurrency
    tenant.fair_weight = limits.weight
    session.add(tenant)
    await session.flush()
    audit.record(session, "tenant.limits", tenant.name, tenant=tenant.name, before=before, after=limits.model_dump())
    event = TenantEvent(kind=TenantEventKind.LIMITS_CHANGED, tenant=tenant.name, limits=limits)
    outbox.enqueue_message(session, subjects.tenant_event(event.kind), event, event.event_id)
    return tenant


async def list_keys(session: AsyncSession, tenant: Tenant) -> list[ApiKey]:
    query = select(ApiKey).where(ApiKey.tenant_id == tenant.id).order_by(col(ApiKey.created_at))
    return list((await session.exec(query)).all())


async def revoke_key(session: AsyncSession, tenant: Tenant, key_id: str) -> ApiKey:
    """Revoke one key (idempotent); every gateway drops the tenant's cached answers at the event, so
    the key stops working everywhere within the event's delivery time, not the cache TTL."""
    key = (await session.exec(select(ApiKey).where(ApiKey.tenant_id == tenant.id, ApiKey.key_id == key_id))).first()
    if key is None:
        raise NotFound(f"tenant {tenant.name!r} has no key {key_id!r}", code="key_not_found")
    if key.revoked_at is None:
        key.revoked_at = datetime.now(UTC)
        session.add(key)
        await session.flush()
        after = {"kind": key.kind, "revoked_at": key.revoked_at}
        audit.record(session, "key.revoked", key_id, tenant=tenant.name, before={"revoked_at": None}, after=after)
        event = TenantEvent(kind=TenantEventKind.KEY_REVOKED, tenant=tenant.name, key_id=key_id)
        outbox.enqueue_message(session, subjects.tenant_event(event.kind), event, event.event_id)
    return key
