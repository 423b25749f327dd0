"""A tenant's metered usage and its estimated cost (admin, or the tenant's maintainer)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from services.registry import aliases, usage
from services.registry.cost import cost_basis
from services.registry.routes.deps import LOOKUP, Ctx, Name, tenant_router
from services.registry.validation import check_name

router: APIRouter = tenant_router()


class UsageRowPublic(BaseModel):
    adapter: str = Field(description="name-vN, or the base model's name")
    hour: datetime
    requests: int
    prompt_tokens: int
    completion_tokens: int
    errors: int


class CostPublic(BaseModel):
    """An estimate: each input says whether it is measured, configured or assumed."""

    usd: float = Field(description="estimated cost of the completion tokens in the period")
    usd_per_million_tokens: float = Field(description="(GPU $/h) / (output tok/s per GPU x 3600) x 1e6")
    gpu_price_per_hour: float
    gpu_price_source: str
    tok_s_per_gpu: float
    tok_s_source: str


class UsagePublic(BaseModel):
    tenant: str
    since: datetime
    rows: list[UsageRowPublic]
    totals: dict[str, int]
    cost: CostPublic


@router.get("/tenants/{tenant}/usage", tags=["usage"], responses=LOOKUP)
async def tenant_usage(
    tenant: Name, ctx: Ctx, since_hours: Annotated[float, Query(gt=0, le=24 * 400)] = 24.0
) -> UsagePublic:
    """Requests, prompt and completion tokens and errors per adapter and hour (UTC), each request
    counted once, from the hour `since_hours` ago on."""
    async with ctx.sessions() as session:
        row = await aliases.get_tenant(session, check_name("tenant", tenant))
        found = await usage.summary(session, row, usage.since_of(since_hours))
    rows = [UsageRowPublic(**vars(r)) for r in found.rows]
    totals = found.totals()
    basis = cost_basis(ctx.settings)
    cost = CostPublic(
        usd=round(basis.usd(totals["completion_tokens"]), 6),
        usd_per_million_tokens=round(basis.usd_per_million_tokens, 6),
        gpu_price_per_hour=basis.gpu_price_per_hour,
        gpu_price_source=basis.gpu_price_source,
        tok_s_per_gpu=basis.tok_s_per_gpu,
        tok_s_source=basis.tok_s_source,
    )
    return UsagePublic(tenant=found.tenant, since=found.since, rows=rows, totals=totals, cost=cost)
