"""A version's lifecycle: evaluation, activation override, retirement, rollback (admin, or the tenant's maintainer)."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel, Field

from services.registry import aliases, audit, lifecycle, versions
from services.registry.context import RegistryContext
from services.registry.db import transaction
from services.registry.http_errors import PG_INT_MAX
from services.registry.models import VersionPublic
from services.registry.routes.deps import CHANGES, Ctx, Name, VersionNumber, tenant_router

router: APIRouter = tenant_router()


class OverrideRequest(BaseModel):
    actor: str = Field(min_length=1, max_length=200, description="who overrides the evaluation gate")
    reason: str = Field(min_length=1, max_length=2000)


class EvaluateRequest(BaseModel):
    requested_by: str = Field("admin", min_length=1, max_length=200)


class RetireRequest(BaseModel):
    reason: str = Field("", max_length=2000)


class RollbackRequest(BaseModel):
    to_version: int | None = Field(None, ge=1, le=PG_INT_MAX)


@router.post("/tenants/{tenant}/adapters/{adapter}/rollback", tags=["lifecycle"], responses=CHANGES)
async def rollback(tenant: Name, adapter: Name, body: RollbackRequest, ctx: Ctx) -> VersionPublic:
    async with transaction(ctx.sessions) as session:
        number = await aliases.rollback(session, await aliases.get_tenant(session, tenant), adapter, body.to_version)
    ctx.wake_relay()
    async with ctx.sessions() as session:
        return await versions.show_alias(session, tenant, aliases.pinned_name(adapter, number))


async def _transition(
    ctx: RegistryContext, action: str, tenant: str, adapter: str, number: int, apply
) -> VersionPublic:
    async with transaction(ctx.sessions) as session:
        alias = await aliases.find_alias(
            session, await aliases.get_tenant(session, tenant), aliases.pinned_name(adapter, number)
        )
        vctx = await lifecycle.load_version(session, alias.version_id)
        before = {"status": vctx.version.status}
        await apply(session, vctx)
        after = {"status": vctx.version.status, "reason": vctx.version.status_reason}
        target = aliases.pinned_name(adapter, number)
        audit.record(session, f"version.{action}", target, tenant=tenant, before=before, after=after)
    ctx.wake_relay()
    return await versions.show_version(ctx, alias.version_id)


VERSION = "/tenants/{tenant}/adapters/{adapter}/versions/{number}"


@router.post(f"{VERSION}/evaluating", tags=["lifecycle"], responses=CHANGES)
async def begin_evaluation(tenant: Name, adapter: Name, number: VersionNumber, ctx: Ctx) -> VersionPublic:
    """The eval gate announces that it started on this version (optional: a verdict implies it)."""
    return await _transition(ctx, "evaluating", tenant, adapter, number, lifecycle.begin_evaluation)


@router.post(f"{VERSION}/evaluate", tags=["lifecycle"], responses=CHANGES)
async def request_evaluation(
    tenant: Name, adapter: Name, number: VersionNumber, body: EvaluateRequest, ctx: Ctx
) -> VersionPublic:
    """Ask the eval gate to (re-)evaluate a pending, evaluating or rejected version."""

    async def apply(session, vctx):
        await lifecycle.request_evaluation(session, vctx, body.requested_by)

    return await _transition(ctx, "evaluation_requested", tenant, adapter, number, apply)


@router.post(f"{VERSION}/activate", tags=["lifecycle"], responses=CHANGES)
async def override_activate(
    tenant: Name, adapter: Name, number: VersionNumber, body: OverrideRequest, ctx: Ctx
) -> VersionPublic:
    """Admin override: activate without a passing evaluation. Recorded (actor, reason, time) in the
    version and in the "activated" event."""
    override = lifecycle.Override(actor=body.actor, reason=body.reason)

    async def apply(session, vctx):
        await lifecycle.activate(session, vctx, override=override)

    return await _transition(ctx, "activated", tenant, adapter, number, apply)


@router.post(f"{VERSION}/retire", tags=["lifecycle"], responses=CHANGES)
async def retire(tenant: Name, adapter: Name, number: VersionNumber, body: RetireRequest, ctx: Ctx) -> VersionPublic:
    async def apply(session, vctx):
        await lifecycle.retire(session, vctx, body.reason)

    return await _transition(ctx, "retired", tenant, adapter, number, apply)
