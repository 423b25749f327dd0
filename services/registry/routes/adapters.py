"""Adapter versions: push, list, history (admin, or the tenant's maintainer)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, File, Form, Query, UploadFile
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from services.registry import versions
from services.registry.http_errors import PG_INT_MAX, documented
from services.registry.models import VersionPublic
from services.registry.routes.deps import LOOKUP, NAME_DOC, Ctx, Name, Who, check_tenant, require_admin, tenant_router
from services.registry.uploads import spooled_upload
from services.registry.validation import check_adapter_name, check_name

router: APIRouter = tenant_router()
PUSH_RESPONSES = {200: {"description": "already registered (idempotent)"}, **documented(404, 409, 413)}


class PushReply(BaseModel):
    created: bool
    version: VersionPublic


@router.post("/adapters", tags=["adapters"], responses=PUSH_RESPONSES)
async def push(
    ctx: Ctx,
    tenant: Annotated[str, Form(json_schema_extra=NAME_DOC)],
    adapter: Annotated[str, Form(json_schema_extra=NAME_DOC)],
    base_model: Annotated[str, Form()],
    files: Annotated[list[UploadFile], File()],
    principal: Who,
    dataset: Annotated[str | None, Form()] = None,
    migration_item: Annotated[int | None, Form(ge=1, le=PG_INT_MAX)] = None,
) -> JSONResponse:
    """Push a version: multipart with `tenant`, `adapter`, `base_model` and the adapter's files
    (adapter_config.json and adapter_model.safetensors), optionally `dataset` (the tenant's dataset
    it was trained from: the eval gate evaluates on its eval split). 201 when created, 200 when this
    adapter already has exactly this content."""
    check_tenant(principal, tenant)
    if migration_item is not None:
        await require_admin(principal)  # the trainer's push for a base-model migration
    check_name("tenant", tenant)
    check_adapter_name(adapter)
    with spooled_upload(files, ctx.settings.max_adapter_bytes) as directory:
        result = await versions.push_version(
            ctx,
            tenant=tenant,
            adapter=adapter,
            base_model=base_model,
            directory=directory,
            dataset=dataset or None,
            migration_item=migration_item,
        )
    body = PushReply(created=result.created, version=result.version)
    return JSONResponse(status_code=201 if result.created else 200, content=body.model_dump(mode="json"))


@router.get("/adapters", tags=["adapters"], responses=LOOKUP)
async def list_adapters(ctx: Ctx, principal: Who, tenant: str | None = Query(None)) -> list:
    """Every adapter (a maintainer: its tenant's), or one tenant's."""
    if not principal.is_admin:
        tenant = tenant if tenant is not None else principal.tenant
        check_tenant(principal, tenant)
    async with ctx.sessions() as session:
        return [a.model_dump(mode="json") for a in await versions.list_adapters(session, tenant)]


@router.get("/tenants/{tenant}/adapters/{adapter}/versions", tags=["adapters"], responses=LOOKUP)
async def history(tenant: Name, adapter: Name, ctx: Ctx) -> list[VersionPublic]:
    async with ctx.sessions() as session:
        return await versions.history(session, tenant, adapter)
