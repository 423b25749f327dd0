"""The audit trail, read-only: an admin reads every entry, a maintainer its own tenant's. There is no
route that changes or deletes an entry."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Query

from services.registry import audit
from services.registry.access_models import AuditPublic
from services.registry.routes.deps import NAME_PATTERN, Ctx, Who, check_tenant, tenant_router

router: APIRouter = tenant_router()


@router.get("/audit", tags=["audit"])
async def list_audit(
    ctx: Ctx,
    principal: Who,
    tenant: Annotated[str | None, Query(pattern=NAME_PATTERN)] = None,
    since: datetime | None = None,
    limit: Annotated[int, Query(ge=1, le=audit.MAX_LIMIT)] = 100,
) -> list[AuditPublic]:
    """The newest `limit` changes of state (of `tenant`, from `since` on), oldest first: who (the
    credential's name and scope), when, what, before and after, and the request id."""
    if not principal.is_admin:
        tenant = tenant if tenant is not None else principal.tenant
        check_tenant(principal, tenant)
    if since is not None and since.tzinfo is None:
        since = since.replace(tzinfo=UTC)  # a time without a zone is UTC
    async with ctx.sessions() as session:
        return await audit.entries(session, tenant=tenant, since=since, limit=limit)
