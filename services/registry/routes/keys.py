"""A tenant's inference keys and NATS credentials: add, list, revoke (admin, or the tenant's maintainer)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Path
from pydantic import BaseModel, Field

from services.registry import aliases, keys, tenants
from services.registry.db import transaction
from services.registry.routes.deps import CHANGES, KEY_ID_PATTERN, LOOKUP, Ctx, Name, tenant_router
from services.registry.routes.tenants import TenantCreated
from services.registry.validation import check_name

router: APIRouter = tenant_router()


class ApiKeyPublic(BaseModel):
    key_id: str
    kind: str = Field("inference", description="inference (API key) or nats (a NATS credential)")
    created_at: datetime
    revoked_at: datetime | None = None
    last_used_at: datetime | None = Field(None, description="a NATS credential's last connection")


class NatsCredentialCreated(BaseModel):
    tenant: str
    key_id: str
    nats_user: str = Field(description="the user name the tenant's NATS connection uses")
    credential: str = Field(description="its password; shown once, only its hash is stored")
    nats_url: str


@router.get("/tenants/{tenant}/keys", tags=["tenants"], responses=LOOKUP)
async def list_keys(tenant: Name, ctx: Ctx) -> list[ApiKeyPublic]:
    async with ctx.sessions() as session:
        row = await aliases.get_tenant(session, check_name("tenant", tenant))
        return [ApiKeyPublic.model_validate(k, from_attributes=True) for k in await tenants.list_keys(session, row)]


@router.post("/tenants/{tenant}/keys/{key_id}/revoke", tags=["tenants"], responses=CHANGES)
async def revoke_key(tenant: Name, key_id: Annotated[str, Path(pattern=KEY_ID_PATTERN)], ctx: Ctx) -> ApiKeyPublic:
    """Revoke a key or NATS credential (idempotent). A key stops working at every gateway within about
    a second; a NATS credential's open connections are disconnected and it cannot connect again."""
    async with transaction(ctx.sessions) as session:
        row = await aliases.get_tenant(session, check_name("tenant", tenant))
        key = await tenants.revoke_key(session, row, key_id)
        public = ApiKeyPublic.model_validate(key, from_attributes=True)
    ctx.wake_relay()
    if public.kind == "nats" and ctx.nats_access is not None:
        await ctx.nats_access.disconnect(tenant, key_id)
    return public


@router.post("/tenants/{tenant}/keys", status_code=201, tags=["tenants"], responses=LOOKUP)
async def add_key(tenant: Name, ctx: Ctx) -> TenantCreated:
    async with transaction(ctx.sessions) as session:
        row = await aliases.get_tenant(session, check_name("tenant", tenant))
        key = await tenants.add_key(session, row)
    return TenantCreated(tenant=tenant, api_key=key.plaintext, key_id=key.key_id)


@router.post("/tenants/{tenant}/nats-credentials", status_code=201, tags=["tenants"], responses=LOOKUP)
async def add_nats_credential(tenant: Name, ctx: Ctx) -> NatsCredentialCreated:
    """A NATS credential for the tenant's async client: it may submit the tenant's work and read its
    own results, nothing else (the broker enforces it). Revoke it like a key."""
    async with transaction(ctx.sessions) as session:
        row = await aliases.get_tenant(session, check_name("tenant", tenant))
        key = await tenants.add_key(session, row, keys.NATS)
    url = ctx.settings.nats_public_url or ctx.settings.connections.nats_url
    return NatsCredentialCreated(
        tenant=tenant, key_id=key.key_id, nats_user=f"tenant:{tenant}", credential=key.plaintext, nats_url=url
    )
