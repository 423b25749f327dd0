"""Base models: register and list (the admin scope only)."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel, Field

from libs.models.catalog import BaseModelSpec
from services.registry import audit, bases
from services.registry.db import transaction
from services.registry.errors import Invalid
from services.registry.http_errors import documented
from services.registry.models import BaseModelPublic
from services.registry.routes.deps import Ctx, admin_router
from services.registry.validation import check_base_name

router: APIRouter = admin_router()


class BaseModelCreate(BaseModel):
    name: str
    config: dict = Field(description="the model's Hugging Face config.json")
    source: str = Field("", max_length=2000)


@router.post("/base-models", status_code=201, tags=["base models"], responses=documented(409))
async def register_base(body: BaseModelCreate, ctx: Ctx) -> BaseModelPublic:
    try:
        spec = BaseModelSpec.from_hf_config(body.config, name=check_base_name(body.name))
    except (KeyError, TypeError, ValueError) as exc:
        raise Invalid(f"config is not a usable Hugging Face config.json: missing or bad {exc}") from None
    if body.source:
        spec = BaseModelSpec(**{**spec.__dict__, "source": body.source})
    async with transaction(ctx.sessions) as session:
        row = await bases.register_base(session, spec)
        after = {"layers": spec.num_layers, "hidden": spec.hidden_size, "source": spec.source}
        audit.record(session, "base_model.registered", spec.name, after=after)
    return BaseModelPublic.model_validate(row, from_attributes=True)


@router.get("/base-models", tags=["base models"])
async def list_bases(ctx: Ctx) -> list[BaseModelPublic]:
    async with ctx.sessions() as session:
        return [BaseModelPublic.model_validate(r, from_attributes=True) for r in await bases.list_bases(session)]
