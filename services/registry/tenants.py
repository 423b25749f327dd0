"""Tenants and their API keys."""

from __future__ import annotations

from sqlalchemy.exc import IntegrityError
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from services.registry import keys
from services.registry.errors import Conflict, Unauthorized
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
    return tenant, await add_key(session, tenant)


async def add_key(session: AsyncSession, tenant: Tenant) -> keys.NewKey:
    new = keys.generate(tenant.name)
    session.add(ApiKey(tenant_id=tenant.id, key_id=new.key_id, key_hash=new.key_hash))
    await session.flush()
    return new


async def list_tenants(session: AsyncSession) -> list[Tenant]:
    return list((await session.exec(select(Tenant).order_by(Tenant.name))).all())


async def authenticate(session: AsyncSession, tenant_name: str, api_key: str) -> Tenant:
    """The tenant `api_key` belongs to, provided it is `tenant_name`'s live key; Unauthorized otherwise.
    Every failure gives the same message, so a caller learns nothing about which part was wrong."""
    refused = Unauthorized(f"invalid API key for tenant {tenant_name!r}")
    parsed = keys.parse(api_key)
    if parsed is None or parsed.tenant != tenant_name:
        raise refused
    row = (await session.exec(
        select(ApiKey, Tenant).join(Tenant, col(ApiKey.tenant_id) == col(Tenant.id))
        .where(ApiKey.key_id == parsed.key_id, col(ApiKey.revoked_at).is_(None)))).first()  # fmt: skip
    if row is None:
        raise refused
    key, tenant = row
    if tenant.name != tenant_name or not keys.matches(parsed, key.key_hash):
        raise refused
    return tenant
