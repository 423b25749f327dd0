"""Resolution: (tenant, alias) -> the active version (an admin, the tenant's maintainer or its API key)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header
from pydantic import BaseModel

from libs.contracts import AdapterRef
from services.registry import aliases, keys, tenants
from services.registry.http_errors import documented
from services.registry.routes.deps import Ctx, Name, bearer, check_tenant, principal_of

router = APIRouter(prefix="/v1", tags=["resolve"], responses=documented(400, 401, 403, 404, 422, 503))


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
    given = bearer(authorization) or ""
    if keys.parse(given) is None:  # not a tenant API key: an admin or the tenant's maintainer
        check_tenant(await principal_of(ctx, authorization), tenant)
    async with ctx.sessions() as session:
        if keys.parse(given) is not None:
            await tenants.authenticate(session, tenant, given)
        found = await aliases.resolve(session, tenant, alias)
    return Resolution(
        tenant=found.tenant, alias=found.alias, adapter=found.adapter, version=found.version, ref=found.ref
    )
