"""Training jobs (admin, or the tenant's maintainer): one job on a stored dataset, queued for the
trainers through the outbox (services/registry/training.py)."""

from __future__ import annotations

from fastapi import APIRouter

from services.registry import training
from services.registry.db import transaction
from services.registry.routes.deps import LOOKUP, Ctx, Name, tenant_router

router: APIRouter = tenant_router()


@router.post("/tenants/{tenant}/train", status_code=202, tags=["training"], responses=LOOKUP)
async def train(tenant: Name, body: training.TrainRequest, ctx: Ctx) -> training.TrainQueued:
    """Queue one training job on the tenant's dataset; the trained version is pushed as a new version
    of the adapter and goes through the eval gate. Follow it on `progress_subject` (lpx train)."""
    async with transaction(ctx.sessions) as session:
        job = await training.request_training(session, tenant, body)
    ctx.wake_relay()
    return training.queued(job)
