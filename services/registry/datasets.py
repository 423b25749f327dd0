"""Tenant datasets (chat JSONL with a train and an eval split, see libs.datasets), stored
content-addressed: the trainer trains on the train split, the eval gate evaluates on the eval split."""

from __future__ import annotations

import asyncio
from datetime import datetime
from pathlib import Path

from sqlmodel import SQLModel, select
from sqlmodel.ext.asyncio.session import AsyncSession

from libs.datasets import DatasetInvalid, ParsedDataset, parse_file
from libs.hashing import file_sha256
from libs.objectstore import dataset_key
from services.registry import aliases, audit
from services.registry.context import RegistryContext
from services.registry.db import transaction
from services.registry.errors import Conflict, Invalid
from services.registry.models import Dataset
from services.registry.validation import check_name


class DatasetPublic(SQLModel):
    tenant: str
    name: str
    digest: str
    object_key: str
    size_bytes: int
    examples: int
    train_examples: int
    eval_cases: int
    created_at: datetime


def parse_dataset(path: Path) -> ParsedDataset:
    """Every line checked (libs.datasets); a refusal names each bad line, and nothing is stored."""
    try:
        return parse_file(path)
    except DatasetInvalid as exc:
        raise Invalid(f"dataset refused: {exc}", code="bad_dataset", details={"lines": exc.line_numbers}) from None


def _public(row: Dataset, tenant: str) -> DatasetPublic:
    return DatasetPublic(
        tenant=tenant,
        **row.model_dump(
            include={
                "name",
                "digest",
                "object_key",
                "size_bytes",
                "examples",
                "train_examples",
                "eval_cases",
                "created_at",
            }
        ),
    )


async def store_dataset(ctx: RegistryContext, tenant: str, name: str, path: Path) -> DatasetPublic:
    check_name("tenant", tenant)
    check_name("dataset", name)
    parsed = await asyncio.to_thread(parse_dataset, path)
    digest = await asyncio.to_thread(file_sha256, path)
    async with transaction(ctx.sessions) as session:
        row_tenant = await aliases.get_tenant(session, tenant)
        existing = (
            await session.exec(select(Dataset).where(Dataset.tenant_id == row_tenant.id, Dataset.name == name))
        ).first()
        if existing is not None:
            if existing.digest != digest:
                raise Conflict(f"tenant {tenant!r} already has a different dataset named {name!r}")
            return _public(existing, tenant)
        # The object goes first: a row never points at a missing object (same content, same key).
        await asyncio.to_thread(ctx.store.put_file, dataset_key(digest), path, digest)
        row = Dataset(
            tenant_id=row_tenant.id,
            name=name,
            digest=digest,
            object_key=dataset_key(digest),
            size_bytes=path.stat().st_size,
            examples=parsed.lines,
            train_examples=len(parsed.train),
            eval_cases=len(parsed.eval),
        )
        session.add(row)
        after = {"digest": digest, "examples": parsed.lines, "eval_cases": len(parsed.eval)}
        audit.record(session, "dataset.stored", name, tenant=tenant, after=after)
    return _public(row, tenant)


async def list_datasets(session: AsyncSession, tenant: str) -> list[DatasetPublic]:
    row_tenant = await aliases.get_tenant(session, tenant)
    rows = (await session.exec(select(Dataset).where(Dataset.tenant_id == row_tenant.id).order_by(Dataset.name))).all()
    return [_public(r, tenant) for r in rows]
