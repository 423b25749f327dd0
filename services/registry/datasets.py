"""Training datasets (chat JSONL), stored content-addressed for the trainer's retraining runs."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime
from pathlib import Path

from sqlmodel import SQLModel, select
from sqlmodel.ext.asyncio.session import AsyncSession

from libs.hashing import file_sha256
from libs.objectstore import dataset_key
from services.registry import aliases
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
    created_at: datetime


def count_examples(path: Path) -> int:
    """Each non-empty line must be a JSON object with a non-empty `messages` list."""
    count = 0
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                doc = json.loads(line)
            except json.JSONDecodeError as exc:
                raise Invalid(f"dataset line {number} is not JSON: {exc.msg}", code="bad_dataset") from None
            if not isinstance(doc, dict) or not isinstance(doc.get("messages"), list) or not doc["messages"]:
                raise Invalid(f"dataset line {number} needs a non-empty 'messages' list", code="bad_dataset")
            count += 1
    if not count:
        raise Invalid("the dataset has no examples", code="bad_dataset")
    return count


def _public(row: Dataset, tenant: str) -> DatasetPublic:
    return DatasetPublic(tenant=tenant, **row.model_dump(include={"name", "digest", "object_key", "size_bytes",
                                                                  "examples", "created_at"}))  # fmt: skip


async def store_dataset(ctx: RegistryContext, tenant: str, name: str, path: Path) -> DatasetPublic:
    check_name("tenant", tenant)
    check_name("dataset", name)
    try:
        examples = await asyncio.to_thread(count_examples, path)
    except UnicodeDecodeError:
        raise Invalid("the dataset is not UTF-8 text", code="bad_dataset") from None
    digest = await asyncio.to_thread(file_sha256, path)
    async with transaction(ctx.sessions) as session:
        row_tenant = await aliases.get_tenant(session, tenant)
        existing = (await session.exec(select(Dataset).where(Dataset.tenant_id == row_tenant.id,
                                                             Dataset.name == name))).first()  # fmt: skip
        if existing is not None:
            if existing.digest != digest:
                raise Conflict(f"tenant {tenant!r} already has a different dataset named {name!r}")
            return _public(existing, tenant)
        # The object goes first: a row never points at a missing object (same content, same key).
        await asyncio.to_thread(ctx.store.put_file, dataset_key(digest), path, digest)
        row = Dataset(tenant_id=row_tenant.id, name=name, digest=digest, object_key=dataset_key(digest),
                      size_bytes=path.stat().st_size, examples=examples)  # fmt: skip
        session.add(row)
    return _public(row, tenant)


async def list_datasets(session: AsyncSession, tenant: str) -> list[DatasetPublic]:
    row_tenant = await aliases.get_tenant(session, tenant)
    rows = (await session.exec(select(Dataset).where(Dataset.tenant_id == row_tenant.id).order_by(Dataset.name))).all()
    return [_public(r, tenant) for r in rows]
