"""Base-model migrations: retrain every adapter served on base A for base B, from its stored dataset.

`start` writes the migration, one item per adapter and one TrainJob per item (through the outbox, in
the same transaction: the jobs reach the trainers' work queue exactly once, even if the registry
crashes right after). Each trained version is pushed with its item's id, which links it; the eval gate
for base B then compares it with the version it replaces, and activation moves the tenant's aliases
to base B only on pass. An item's state is derived, never stored twice:

    training   no new version yet (queued or being trained)
    evaluating the new version awaits its verdict
    passed     the new version is active: the tenant serves on base B
    failed     training failed or the new version was rejected: the tenant stays on base A

The migration is done when every item is passed or failed.
"""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import datetime

from pydantic import BaseModel
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from libs.contracts import DatasetRef, TrainJob, subjects
from libs.lora.train import DEFAULT_TARGETS
from services.registry.bases import get_base
from services.registry.errors import Conflict, Invalid, NotFound
from services.registry.models import (
    Adapter,
    AdapterVersion,
    Dataset,
    Migration,
    MigrationItem,
    Tenant,
    VersionStatus,
    utcnow,
)
from services.registry.outbox import enqueue_message

FINAL_STATES = ("passed", "failed")


class PlanItem(BaseModel):
    tenant: str
    adapter: str
    version: int
    dataset: str | None
    train_examples: int = 0
    reason: str = ""  # why it cannot be migrated (no dataset)


class MigrationPlan(BaseModel):
    from_base: str
    to_base: str
    items: list[PlanItem]

    @property
    def trainable(self) -> list[PlanItem]:
        return [i for i in self.items if i.dataset is not None]


class ItemStatus(BaseModel):
    id: int
    tenant: str
    adapter: str
    old_version: int
    new_version: int | None
    job_id: str
    state: str
    reason: str = ""


class MigrationStatus(BaseModel):
    id: str
    from_base: str
    to_base: str
    recipe: dict
    created_at: datetime
    done: bool
    counts: dict[str, int]
    items: list[ItemStatus]


async def plan(session: AsyncSession, from_base: str, to_base: str) -> MigrationPlan:
    await get_base(session, from_base)
    await get_base(session, to_base)
    if from_base == to_base:
        raise Invalid("a migration needs two different base models")
    items = []
    for tenant, adapter, version, dataset in await _served_on(session, from_base):
        items.append(
            PlanItem(
                tenant=tenant.name,
                adapter=adapter.name,
                version=version.number,
                dataset=dataset.name if dataset else None,
                train_examples=dataset.train_examples if dataset else 0,
                reason="" if dataset else "no stored dataset with train examples to retrain from",
            )
        )
    return MigrationPlan(from_base=from_base, to_base=to_base, items=items)


async def _served_on(session: AsyncSession, base: str):
    """(tenant, adapter, served version, dataset to retrain from) for every adapter serving on `base`."""
    query = (
        select(Tenant, Adapter, AdapterVersion)
        .join(Adapter, col(Adapter.tenant_id) == col(Tenant.id))
        .join(AdapterVersion, col(AdapterVersion.id) == col(Adapter.current_version_id))
        .where(AdapterVersion.base_model == base)
        .order_by(col(Tenant.name), col(Adapter.name))
    )
    found = []
    for tenant, adapter, version in (await session.exec(query)).all():
        found.append((tenant, adapter, version, await _training_set(session, tenant, version)))
    return found


async def _training_set(session: AsyncSession, tenant: Tenant, version: AdapterVersion) -> Dataset | None:
    """The dataset the version was trained from, else the tenant's newest dataset with train examples."""
    if version.dataset_id is not None:
        row = (await session.exec(select(Dataset).where(Dataset.id == version.dataset_id))).one()
        if row.train_examples > 0:
            return row
    query = (
        select(Dataset)
        .where(Dataset.tenant_id == tenant.id, Dataset.train_examples > 0)
        .order_by(col(Dataset.created_at).desc(), col(Dataset.id).desc())
    )
    return (await session.exec(query)).first()


async def start(session: AsyncSession, *, from_base: str, to_base: str, recipe: dict, requested_by: str) -> Migration:
    await plan(session, from_base, to_base)  # bases known and distinct
    for running in await _unfinished(session, from_base, to_base):
        raise Conflict(f"migration {running} from {from_base} to {to_base} is still running", code="migration_running")
    migration = Migration(
        id=f"mig-{uuid.uuid4().hex[:10]}",
        from_base=from_base,
        to_base=to_base,
        recipe=recipe,
        requested_by=requested_by,
    )
    session.add(migration)
    await session.flush()
    for tenant, adapter, version, dataset in await _served_on(session, from_base):
        item = MigrationItem(
            migration_id=migration.id,
            tenant_id=tenant.id,
            adapter_id=adapter.id,
            old_version_id=version.id,
            dataset_id=dataset.id if dataset else None,
            job_id=f"{migration.id}-{adapter.id}",
            error=None if dataset else "no stored dataset with train examples to retrain from",
        )
        session.add(item)
        await session.flush()
        if dataset is not None:
            job = _job(migration, item, tenant, adapter, dataset, recipe)
            enqueue_message(session, subjects.TRAIN_JOBS, job, job.job_id)
    return migration


def _job(
    migration: Migration, item: MigrationItem, tenant: Tenant, adapter: Adapter, dataset: Dataset, recipe: dict
) -> TrainJob:
    ref = DatasetRef(
        name=dataset.name,
        digest=dataset.digest,
        object_key=dataset.object_key,
        train_examples=dataset.train_examples,
        eval_cases=dataset.eval_cases,
    )
    return TrainJob(
        job_id=item.job_id,
        tenant=tenant.name,
        adapter=adapter.name,
        dataset=ref,
        base_model=migration.to_base,
        migration_id=migration.id,
        migration_item=item.id,
        requested_by=f"migration {migration.id}",
        **recipe,
    )


def default_recipe(max_rank: int, steps: int, seed: int, batch_size: int = 4) -> dict:
    """The pool policy's recipe: its max rank, alpha 2 x rank, every projection targeted."""
    return {
        "rank": max_rank,
        "alpha": 2 * max_rank,
        "target_modules": list(DEFAULT_TARGETS),
        "steps": steps,
        "seed": seed,
        "batch_size": batch_size,
    }


async def _unfinished(session: AsyncSession, from_base: str, to_base: str) -> list[str]:
    rows = (
        await session.exec(select(Migration.id).where(Migration.from_base == from_base, Migration.to_base == to_base))
    ).all()
    return [m for m in rows if not (await status(session, m)).done]


async def status(session: AsyncSession, migration_id: str) -> MigrationStatus:
    migration = (await session.exec(select(Migration).where(Migration.id == migration_id))).first()
    if migration is None:
        raise NotFound(f"no migration {migration_id!r}")
    query = (
        select(MigrationItem, Tenant, Adapter)
        .join(Tenant, col(Tenant.id) == col(MigrationItem.tenant_id))
        .join(Adapter, col(Adapter.id) == col(MigrationItem.adapter_id))
        .where(MigrationItem.migration_id == migration_id)
        .order_by(col(MigrationItem.id))
    )
    items = []
    for item, tenant, adapter in (await session.exec(query)).all():
        old = (await session.exec(select(AdapterVersion).where(AdapterVersion.id == item.old_version_id))).one()
        new = None
        if item.new_version_id is not None:
            new = (await session.exec(select(AdapterVersion).where(AdapterVersion.id == item.new_version_id))).one()
        state, reason = _state(item, new)
        items.append(
            ItemStatus(
                id=item.id,
                tenant=tenant.name,
                adapter=adapter.name,
                old_version=old.number,
                new_version=new.number if new else None,
                job_id=item.job_id,
                state=state,
                reason=reason,
            )
        )
    counts = Counter(i.state for i in items)
    return MigrationStatus(
        id=migration.id,
        from_base=migration.from_base,
        to_base=migration.to_base,
        recipe=migration.recipe,
        created_at=migration.created_at,
        done=all(i.state in FINAL_STATES for i in items),
        counts=dict(counts),
        items=items,
    )


def _state(item: MigrationItem, new: AdapterVersion | None) -> tuple[str, str]:
    if item.error:
        return "failed", item.error
    if new is None:
        return "training", ""
    if new.status in (VersionStatus.PENDING, VersionStatus.EVALUATING):
        return "evaluating", ""
    if new.status in (VersionStatus.ACTIVE, VersionStatus.RETIRED):
        return "passed", new.status_reason
    return "failed", new.status_reason


async def list_migrations(session: AsyncSession) -> list[MigrationStatus]:
    ids = (await session.exec(select(Migration.id).order_by(col(Migration.created_at)))).all()
    return [await status(session, m) for m in ids]


async def link_version(session: AsyncSession, item_id: int, version: AdapterVersion, tenant: Tenant) -> None:
    """A trained version pushed for a migration item: remember it (the same push twice links once)."""
    item = (await session.exec(select(MigrationItem).where(MigrationItem.id == item_id).with_for_update())).first()
    if item is None or item.tenant_id != tenant.id or item.adapter_id != version.adapter_id:
        raise Invalid(f"migration item {item_id} is not a migration of this adapter")
    if item.new_version_id not in (None, version.id):
        raise Conflict(f"migration item {item_id} already has version id {item.new_version_id}")
    item.new_version_id = version.id
    item.updated_at = utcnow()
    session.add(item)


async def fail_item(session: AsyncSession, migration_id: str, item_id: int, reason: str) -> None:
    item = (
        await session.exec(
            select(MigrationItem).where(MigrationItem.id == item_id, MigrationItem.migration_id == migration_id)
        )
    ).first()
    if item is None:
        raise NotFound(f"migration {migration_id!r} has no item {item_id}")
    if item.new_version_id is None:
        item.error = reason[:2000] or "training failed"
        item.updated_at = utcnow()
        session.add(item)
