"""Registry credentials: create, list, revoke. An admin manages every credential; a tenant's maintainer
manages its own tenant's maintainer credentials (another tenant's answer exactly like missing ones)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query
from pydantic import BaseModel, Field

from services.registry import aliases, credentials
from services.registry.access_models import ADMIN, MAINTAINER, CredentialPublic
from services.registry.db import transaction
from services.registry.errors import Forbidden
from services.registry.http_errors import documented
from services.registry.routes.deps import KEY_ID_PATTERN, LOOKUP, NAME_PATTERN, Ctx, Who, check_tenant, tenant_router

router: APIRouter = tenant_router()


class CredentialCreate(BaseModel):
    name: str = Field(min_length=1, max_length=200, description="who or what holds it, e.g. 'acme-ml-ci'")
    scope: str = Field(MAINTAINER, pattern=f"^({ADMIN}|{MAINTAINER})$", description="admin or maintainer")
    tenant: str | None = Field(None, pattern=NAME_PATTERN, description="a maintainer's tenant (admin: none)")
    expires_in_s: float | None = Field(None, gt=0, le=10 * 365 * 24 * 3600, description="none: no expiry")


class CredentialCreated(CredentialPublic):
    token: str = Field(description="the credential; shown once, only its hash is stored")


@router.post("/tokens", status_code=201, tags=["credentials"], responses=LOOKUP)
async def create_token(body: CredentialCreate, ctx: Ctx, principal: Who) -> CredentialCreated:
    """A new registry credential. A maintainer may create maintainer credentials of its own tenant."""
    if body.scope == ADMIN and not principal.is_admin:
        raise Forbidden(f"credential {principal.name!r} may not create admin credentials")
    if body.scope == MAINTAINER:
        check_tenant(principal, body.tenant)
    async with transaction(ctx.sessions) as session:
        tenant = await aliases.get_tenant(session, body.tenant) if body.scope == MAINTAINER and body.tenant else None
        new = await credentials.create(
            session,
            name=body.name,
            scope=body.scope,
            tenant=tenant,
            created_by=principal.name,
            expires_in_s=body.expires_in_s,
        )
    public = credentials.public(new.row, body.tenant if tenant is not None else None)
    return CredentialCreated(**public.model_dump(), token=new.plaintext)


@router.get("/tokens", tags=["credentials"])
async def list_tokens(
    ctx: Ctx, principal: Who, tenant: Annotated[str | None, Query(pattern=NAME_PATTERN)] = None
) -> list[CredentialPublic]:
    """Every credential (a maintainer: its tenant's), or one tenant's maintainer credentials."""
    if not principal.is_admin:
        tenant = tenant if tenant is not None else principal.tenant
        check_tenant(principal, tenant)
    async with ctx.sessions() as session:
        return await credentials.listing(session, tenant)


@router.post("/tokens/{token_id}/revoke", tags=["credentials"], responses=documented(404))
async def revoke_token(
    token_id: Annotated[str, Path(pattern=KEY_ID_PATTERN)], ctx: Ctx, principal: Who
) -> CredentialPublic:
    """Revoke a credential (idempotent): refused from the next request on, on every registry replica."""
    async with transaction(ctx.sessions) as session:
        return await credentials.revoke(session, token_id, None if principal.is_admin else principal.tenant)
