"""Tenants: create, list, update, limits (the admin scope only)."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel, Field

from libs.contracts import TenantLimits
from services.registry import aliases, audit, tenants
from services.registry.db import transaction
from services.registry.http_errors import documented
from services.registry.models import TenantPublic
from services.registry.routes.deps import LOOKUP, Ctx, Name, admin_router, name_field
from services.registry.validation import check_name

router: APIRouter = admin_router()


class TenantCreate(BaseModel):
    name: str = name_field()


class TenantCreated(BaseModel):
    tenant: str
    api_key: str = Field(description="shown once; only its hash is stored")
    key_id: str


class TenantUpdate(BaseModel):
    eval_threshold: float | None = Field(
        None, ge=0, le=1, description="pass rate a new version needs (null: the eval gate's default)"
    )


@router.post("/tenants", status_code=201, tags=["tenants"], responses=documented(409))
async def create_tenant(body: TenantCreate, ctx: Ctx) -> TenantCreated:
    async with transaction(ctx.sessions) as session:
        tenant, key = await tenants.create_tenant(session, body.name)
    return TenantCreated(tenant=tenant.name, api_key=key.plaintext, key_id=key.key_id)


@router.get("/tenants", tags=["tenants"])
async def list_tenants(ctx: Ctx) -> list[TenantPublic]:
    async with ctx.sessions() as session:
        return [TenantPublic.model_validate(t, from_attributes=True) for t in await tenants.list_tenants(session)]


@router.patch("/tenants/{tenant}", tags=["tenants"], responses=LOOKUP)
async def update_tenant(tenant: Name, body: TenantUpdate, ctx: Ctx) -> TenantPublic:
    async with transaction(ctx.sessions) as session:
        row = await aliases.get_tenant(session, check_name("tenant", tenant))
        before = {"eval_threshold": row.eval_threshold}
        row.eval_threshold = body.eval_threshold
        audit.record(session, "tenant.updated", tenant, tenant=tenant, before=before, after=body.model_dump())
        session.add(row)
        await session.flush()
        return TenantPublic.model_validate(row, from_attributes=True)


@router.put("/tenants/{tenant}/limits", tags=["tenants"], responses=LOOKUP)
async def set_limits(tenant: Name, body: TenantLimits, ctx: Ctx) -> TenantPublic:
    """Replace the tenant's limits (a field left out or null: the pool default). Every gateway picks
    the change up from the registry's event."""
    async with transaction(ctx.sessions) as session:
        row = await aliases.get_tenant(session, check_name("tenant", tenant))
        await tenants.set_limits(session, row, body)
        public = TenantPublic.model_validate(row, from_attributes=True)
    ctx.wake_relay()
    return public
