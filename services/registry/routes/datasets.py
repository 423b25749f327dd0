"""A tenant's training datasets: upload and list (admin, or the tenant's maintainer)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, File, Form, UploadFile

from services.registry import datasets
from services.registry.http_errors import documented
from services.registry.routes.deps import LOOKUP, NAME_DOC, Ctx, Name, Who, check_tenant, tenant_router
from services.registry.uploads import spooled_upload

router: APIRouter = tenant_router()


@router.post("/datasets", status_code=201, tags=["datasets"], responses=documented(404, 409, 413))
async def upload_dataset(
    ctx: Ctx,
    tenant: Annotated[str, Form(json_schema_extra=NAME_DOC)],
    name: Annotated[str, Form(json_schema_extra=NAME_DOC)],
    file: Annotated[UploadFile, File()],
    principal: Who,
) -> datasets.DatasetPublic:
    check_tenant(principal, tenant)
    with spooled_upload([file], ctx.settings.max_adapter_bytes) as directory:
        return await datasets.store_dataset(ctx, tenant, name, directory / (file.filename or ""))


@router.get("/tenants/{tenant}/datasets", tags=["datasets"], responses=LOOKUP)
async def list_datasets(tenant: Name, ctx: Ctx) -> list[datasets.DatasetPublic]:
    async with ctx.sessions() as session:
        return await datasets.list_datasets(session, tenant)
