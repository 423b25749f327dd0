"""A tenant's aliases: list, create, show (admin, or the tenant's maintainer)."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel

from services.registry import aliases, audit, versions
from services.registry.db import transaction
from services.registry.models import AliasPublic, VersionPublic
from services.registry.routes.deps import CHANGES, LOOKUP, Ctx, Name, name_field, tenant_router

router: APIRouter = tenant_router()


class AliasCreate(BaseModel):
    name: str = name_field()
    adapter: str = name_field()


@router.get("/tenants/{tenant}/aliases", tags=["aliases"], responses=LOOKUP)
async def list_aliases(tenant: Name, ctx: Ctx) -> list[AliasPublic]:
    async with ctx.sessions() as session:
        return await aliases.list_aliases(session, await aliases.get_tenant(session, tenant))


@router.post("/tenants/{tenant}/aliases", status_code=201, tags=["aliases"], responses=CHANGES)
async def create_alias(tenant: Name, body: AliasCreate, ctx: Ctx) -> AliasPublic:
    async with transaction(ctx.sessions) as session:
        row = await aliases.get_tenant(session, tenant)
        await aliases.add_follow(session, row, await aliases.get_adapter(session, row, body.adapter), body.name)
        audit.record(session, "alias.created", body.name, tenant=tenant, after={"adapter": body.adapter})
    ctx.wake_relay()
    async with ctx.sessions() as session:
        found = [a for a in await aliases.list_aliases(session, row) if a.name == body.name]
    return found[0]


@router.get("/tenants/{tenant}/aliases/{alias}", tags=["aliases"], responses=LOOKUP)
async def show_alias(tenant: Name, alias: Name, ctx: Ctx) -> VersionPublic:
    """The version an alias points at now, whatever its status."""
    async with ctx.sessions() as session:
        return await versions.show_alias(session, tenant, alias)
