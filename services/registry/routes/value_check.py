"""A tenant's value check in the eval gate (admin, or the tenant's maintainer): the minimum lift over
the base model a new version needs, and the system prompt the base model is also scored with. The
pass-rate threshold and the limits stay the admin's (services/registry/routes/tenants.py)."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel, Field

from services.registry import aliases, audit
from services.registry.db import transaction
from services.registry.routes.deps import LOOKUP, Ctx, Name, tenant_router
from services.registry.validation import check_name

router: APIRouter = tenant_router()
MAX_SYSTEM_PROMPT_CHARS = 8000


class ValueCheck(BaseModel):
    tenant: str
    min_lift: float | None = Field(
        None, description="pass-rate lift over the base model a new version needs (null: the gate's setting)"
    )
    system_prompt: str | None = Field(
        None, description="the base model is also scored with this system prompt (null: without one only)"
    )


class ValueCheckUpdate(BaseModel):
    """Only the fields sent change; null clears one."""

    min_lift: float | None = Field(None, ge=-1, le=1)
    system_prompt: str | None = Field(None, min_length=1, max_length=MAX_SYSTEM_PROMPT_CHARS)


@router.get("/tenants/{tenant}/value-check", tags=["tenants"], responses=LOOKUP)
async def get_value_check(tenant: Name, ctx: Ctx) -> ValueCheck:
    async with ctx.sessions() as session:
        row = await aliases.get_tenant(session, check_name("tenant", tenant))
        return ValueCheck(tenant=row.name, min_lift=row.min_lift, system_prompt=row.system_prompt)


@router.patch("/tenants/{tenant}/value-check", tags=["tenants"], responses=LOOKUP)
async def set_value_check(tenant: Name, body: ValueCheckUpdate, ctx: Ctx) -> ValueCheck:
    """Set the tenant's minimum lift and/or system prompt for the eval gate's value check (from the
    next evaluation on)."""
    changes = body.model_dump(include=body.model_fields_set)
    async with transaction(ctx.sessions) as session:
        row = await aliases.get_tenant(session, check_name("tenant", tenant))
        before = {k: getattr(row, k) for k in changes}
        for key, value in changes.items():
            setattr(row, key, value)
        if changes:  # nothing sent: nothing changed, nothing recorded
            session.add(row)
            await session.flush()
            audit.record(session, "tenant.value_check", tenant, tenant=tenant, before=before, after=changes)
        return ValueCheck(tenant=row.name, min_lift=row.min_lift, system_prompt=row.system_prompt)
