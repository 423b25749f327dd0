"""Base-model migrations and the orphan sweep (the admin scope only)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query
from pydantic import BaseModel, Field

from services.registry import audit, base_migrations, orphans
from services.registry.db import transaction
from services.registry.http_errors import PG_INT_MAX
from services.registry.routes.deps import CHANGES, LOOKUP, Ctx, admin_router

router: APIRouter = admin_router()


class MigrationCreate(BaseModel):
    from_base: str
    to_base: str
    steps: int = Field(30, ge=1, le=100_000, description="training steps per adapter")
    batch_size: int = Field(4, ge=1, le=1024)
    seed: int = Field(0, ge=0, le=2**32 - 1)
    requested_by: str = Field("admin", min_length=1, max_length=200)


class ItemFailure(BaseModel):
    reason: str = Field(min_length=1, max_length=2000)


@router.get("/migrations/plan", tags=["migrations"], responses=LOOKUP)
async def migration_plan(
    ctx: Ctx, from_base: str = Query(...), to_base: str = Query(...)
) -> base_migrations.MigrationPlan:
    """Every adapter served on `from_base` and the dataset it would be retrained from."""
    async with ctx.sessions() as session:
        return await base_migrations.plan(session, from_base, to_base)


@router.post("/migrations", status_code=201, tags=["migrations"], responses=CHANGES)
async def start_migration(body: MigrationCreate, ctx: Ctx) -> base_migrations.MigrationStatus:
    """Start a migration: one training job per adapter, through the outbox (exactly once)."""
    recipe = base_migrations.default_recipe(ctx.settings.max_rank, body.steps, body.seed, body.batch_size)
    async with transaction(ctx.sessions) as session:
        migration = await base_migrations.start(
            session, from_base=body.from_base, to_base=body.to_base, recipe=recipe, requested_by=body.requested_by
        )
        after = {"from_base": body.from_base, "to_base": body.to_base, "steps": body.steps}
        audit.record(session, "migration.started", str(migration.id), after=after)
    ctx.wake_relay()
    async with ctx.sessions() as session:
        return await base_migrations.status(session, migration.id)


@router.get("/migrations", tags=["migrations"])
async def list_migrations(ctx: Ctx) -> list[base_migrations.MigrationStatus]:
    async with ctx.sessions() as session:
        return await base_migrations.list_migrations(session)


@router.get("/migrations/{migration_id}", tags=["migrations"], responses=LOOKUP)
async def migration_status(migration_id: str, ctx: Ctx) -> base_migrations.MigrationStatus:
    async with ctx.sessions() as session:
        return await base_migrations.status(session, migration_id)


@router.post("/migrations/{migration_id}/items/{item_id}/failed", tags=["migrations"], responses=CHANGES)
async def migration_item_failed(
    migration_id: str, item_id: Annotated[int, Path(ge=1, le=PG_INT_MAX)], body: ItemFailure, ctx: Ctx
) -> dict:
    """The trainer reports that an item's training failed (the tenant stays on the old base)."""
    async with transaction(ctx.sessions) as session:
        await base_migrations.fail_item(session, migration_id, item_id, body.reason)
        target = f"{migration_id}/items/{item_id}"
        audit.record(session, "migration.item_failed", target, after={"reason": body.reason})
    return {"ok": True}


@router.post("/admin/sweep-orphans", tags=["maintenance"])
async def sweep(ctx: Ctx, grace_s: float | None = Query(None, ge=0, le=10 * 365 * 24 * 3600)) -> dict:
    """Delete stored adapter objects no version refers to (older than the grace period); the sweep is
    recorded in the audit trail after the deletions (objects are not transactional)."""
    swept = await orphans.sweep_orphans(ctx, grace_s)
    if swept:
        async with transaction(ctx.sessions) as session:
            audit.record(session, "objects.swept", "adapters", after={"digests": swept})
    return {"swept": swept}
