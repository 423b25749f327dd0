"""Resolution: (tenant, alias) -> the active version (the admin token or the tenant's API key)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header
from pydantic import BaseModel

from libs.contracts import AdapterRef
from services.registry import aliases, tenants
from services.registry.http_errors import documented
from services.registry.routes.deps import Ctx, Name, bearer, is_admin

router = APIRouter(prefix="/v1", tags=["resolve"], responses=documented(400, 401, 404, 422, 503))


class Resolution(BaseModel):
    tenant: str
    alias: str
    adapter: str
    version: int
    ref: AdapterRef


@router.get("/resolve/{tenant}/{alias}")
async def resolve(
    tenant: Name, alias: Name, ctx: Ctx, authorization: Annotated[str | None, Header()] = None
) -> Resolution:
    """(tenant, alias) -> the active version's digest, object key, base model and rank."""
    async with ctx.sessions() as session:
        if not is_admin(ctx, authorization):
            await tenants.authenticate(session, tenant, bearer(authorization) or "")
        found = await aliases.resolve(session, tenant, alias)
    return Resolution(
        tenant=found.tenant, alias=found.alias, adapter=found.adapter, version=found.version, ref=found.ref
    )
