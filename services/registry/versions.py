"""Registering versions (push) and reading them back (list, show, history).

Push order, and why:
1. validate everything (names, tenant, base, layout, size, structure, NaN/Inf) -> a refused push
   leaves no row and no object;
2. under an advisory lock on the digest: skip if this adapter already has the digest (idempotent),
   upload under the content address (verified), then one transaction: version row (pending), the
   adapter's version number, the pinned alias `<adapter>-v<N>` and the "registered" outbox event;
3. if that transaction fails for another reason than "already there", delete the object we created,
   but only while the lock is provably still held (checked on the lock's own connection); otherwise
   the unreferenced object is left for the orphan sweeper. A version row never exists without its
   object: the object is written first and is deleted only when no row references it.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.exc import IntegrityError
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from libs.contracts import AdapterEventKind
from libs.lora.format import ADAPTER_FILES, AdapterFiles
from libs.lora.validate import canonical_dtype
from libs.objectstore import adapter_prefix
from services.registry import aliases, audit, base_migrations, lifecycle
from services.registry.bases import get_base, spec_from_row
from services.registry.context import RegistryContext, digest_lock
from services.registry.db import is_unavailable, transaction
from services.registry.errors import Conflict, NotFound, Unavailable
from services.registry.models import (
    Adapter,
    AdapterPublic,
    AdapterVersion,
    Alias,
    AliasKind,
    Dataset,
    Tenant,
    VersionPublic,
    VersionStatus,
    utcnow,
)
from services.registry.outbox import enqueue
from services.registry.validation import check_adapter_name, check_base_name, check_name, validate_upload

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PushResult:
    version: VersionPublic
    created: bool  # False: the same content was already this adapter's version (idempotent push)


async def push_version(
    ctx: RegistryContext,
    *,
    tenant: str,
    adapter: str,
    base_model: str,
    directory: Path,
    dataset: str | None = None,
    migration_item: int | None = None,
) -> PushResult:
    """`dataset` names the tenant's dataset the adapter was trained from (its eval split is what the
    eval gate evaluates); it must exist. `migration_item` links the version to the base-model
    migration item it was trained for."""
    check_name("tenant", tenant)
    check_adapter_name(adapter)
    check_base_name(base_model)
    async with ctx.sessions() as session:
        row_tenant = await aliases.get_tenant(session, tenant)
        spec = spec_from_row(await get_base(session, base_model))
        dataset_id = await _dataset_id(session, row_tenant, dataset) if dataset else None
    files = await asyncio.to_thread(
        validate_upload, directory, spec, ctx.settings.policy(), ctx.settings.max_adapter_bytes
    )
    async with digest_lock(ctx.engine, files.digest) as lock:
        existing = await _existing_version_id(ctx, tenant, adapter, files.digest)
        if existing is not None:
            if migration_item is not None:
                await _link_existing(ctx, existing, migration_item)
            return PushResult(await show_version(ctx, existing), created=False)
        created_object = not await asyncio.to_thread(_has_object, ctx, files.digest)
        if created_object:
            await asyncio.to_thread(ctx.store.put_adapter, directory, files.file_digests)
        ctx.hooks.fire("after_upload")
        try:
            version_id = await _insert_version(ctx, tenant, adapter, base_model, files, dataset_id, migration_item)
        except IntegrityError as exc:
            existing = await _existing_version_id(ctx, tenant, adapter, files.digest)
            if existing is None:
                await _discard_object(ctx, lock, files.digest, created_object)
                detail = str(getattr(exc, "orig", exc)).splitlines()[0]
                raise Conflict(f"could not register {tenant}/{adapter}: {detail}") from exc
            return PushResult(await show_version(ctx, existing), created=False)
        except Exception as exc:
            await _discard_object(ctx, lock, files.digest, created_object)
            if is_unavailable(exc):
                raise Unavailable(f"registry database unavailable; nothing was registered ({exc})") from exc
            raise
    ctx.wake_relay()
    return PushResult(await show_version(ctx, version_id), created=True)


def _has_object(ctx: RegistryContext, digest: str) -> bool:
    prefix = adapter_prefix(digest)
    return all(ctx.store.exists(prefix + name) for name in ADAPTER_FILES)


async def _existing_version_id(ctx: RegistryContext, tenant: str, adapter: str, digest: str) -> int | None:
    async with ctx.sessions() as session:
        query = (
            select(AdapterVersion.id)
            .join(Adapter, col(AdapterVersion.adapter_id) == col(Adapter.id))
            .join(Tenant, col(Adapter.tenant_id) == col(Tenant.id))
            .where(Tenant.name == tenant, Adapter.name == adapter, AdapterVersion.digest == digest)
        )
        return (await session.exec(query)).first()


async def _link_existing(ctx: RegistryContext, version_id: int, migration_item: int) -> None:
    async with transaction(ctx.sessions) as session:
        vctx = await lifecycle.load_version(session, version_id, lock=False)
        await base_migrations.link_version(session, migration_item, vctx.version, vctx.tenant)


async def _dataset_id(session: AsyncSession, tenant: Tenant, name: str) -> int:
    check_name("dataset", name)
    found = (await session.exec(select(Dataset.id).where(Dataset.tenant_id == tenant.id, Dataset.name == name))).first()
    if found is None:
        raise NotFound(f"tenant {tenant.name!r} has no dataset named {name!r}")
    return found


async def _insert_version(
    ctx: RegistryContext,
    tenant_name: str,
    adapter_name: str,
    base_name: str,
    files: AdapterFiles,
    dataset_id: int | None = None,
    migration_item: int | None = None,
) -> int:
    async with transaction(ctx.sessions) as session:
        tenant = await aliases.get_tenant(session, tenant_name)
        base = await get_base(session, base_name)
        adapter = await _adapter_for_update(session, tenant, adapter_name)
        adapter.latest_number += 1
        version = AdapterVersion(
            adapter_id=adapter.id,
            number=adapter.latest_number,
            digest=files.digest,
            base_model_id=base.id,
            base_model=base.name,
            rank=files.rank,
            alpha=files.alpha,
            target_modules=files.target_modules,
            dtype=canonical_dtype(next(iter(files.dtypes))),
            size_bytes=files.size_bytes,
            object_key=adapter_prefix(files.digest),
            file_digests=files.file_digests,
            status=VersionStatus.PENDING,
            dataset_id=dataset_id,
        )
        session.add_all([adapter, version])
        await session.flush()
        await aliases.add_pinned(session, tenant, adapter, version)
        if migration_item is not None:
            await base_migrations.link_version(session, migration_item, version, tenant)
        after = {"digest": files.digest, "status": VersionStatus.PENDING, "base_model": base.name, "rank": files.rank}
        if migration_item is not None:
            after["migration_item"] = migration_item
        target = aliases.pinned_name(adapter.name, version.number)
        audit.record(session, "version.pushed", target, tenant=tenant.name, after=after)
        event_ctx = lifecycle.VersionContext(version, adapter, tenant)
        enqueue(
            session,
            event_ctx.event(
                AdapterEventKind.REGISTERED,
                detail="pushed; awaiting evaluation",
                alias=aliases.pinned_name(adapter.name, version.number),
            ),
        )
        await session.flush()
        ctx.hooks.fire("before_commit")
        return version.id


async def _adapter_for_update(session: AsyncSession, tenant: Tenant, name: str) -> Adapter:
    """The adapter row, locked; created (with its default follow-alias) by whichever concurrent push
    gets there first."""
    created = (
        await session.execute(
            insert(Adapter)
            .values(tenant_id=tenant.id, name=name, latest_number=0, created_at=utcnow())
            .on_conflict_do_nothing(constraint="uq_adapters_tenant_name")
            .returning(Adapter.id)
        )
    ).first()
    adapter = await aliases.get_adapter(session, tenant, name, lock=True)
    if created is not None:
        session.add(Alias(tenant_id=tenant.id, name=name, kind=AliasKind.FOLLOW, adapter_id=adapter.id))
    return adapter


async def _discard_object(ctx: RegistryContext, lock, digest: str, created_object: bool) -> None:
    """Delete the object this push created, if no row references it and the digest lock still holds."""
    if not created_object:
        return
    try:
        query = text("SELECT count(*) FROM adapter_versions WHERE digest = :d")
        referenced = (await lock.execute(query, {"d": digest})).scalar_one()
        await lock.commit()
    except Exception as exc:
        log.warning("left object %s for the orphan sweeper: %s", digest[:12], exc)
        return
    if not referenced:
        await asyncio.to_thread(ctx.store.delete_prefix, adapter_prefix(digest))


# --- reading -------------------------------------------------------------------------------------
def to_public(vctx: lifecycle.VersionContext) -> VersionPublic:
    v = vctx.version
    return VersionPublic(
        tenant=vctx.tenant.name,
        adapter=vctx.adapter.name,
        number=v.number,
        alias=aliases.pinned_name(vctx.adapter.name, v.number),
        digest=v.digest,
        base_model=v.base_model,
        rank=v.rank,
        alpha=v.alpha,
        target_modules=list(v.target_modules),
        dtype=v.dtype,
        size_bytes=v.size_bytes,
        object_key=v.object_key,
        dataset=vctx.dataset_name,
        status=v.status,
        status_reason=v.status_reason,
        current=vctx.adapter.current_version_id == v.id,
        eval_report=v.eval_report,
        override_by=v.override_by,
        override_reason=v.override_reason,
        override_at=v.override_at,
        created_at=v.created_at,
        status_changed_at=v.status_changed_at,
    )


async def show_version(ctx: RegistryContext, version_id: int) -> VersionPublic:
    async with ctx.sessions() as session:
        return to_public(await lifecycle.load_version(session, version_id, lock=False))


async def show_alias(session: AsyncSession, tenant_name: str, alias_name: str) -> VersionPublic:
    """The version an alias points at now, whatever its status (resolution is stricter)."""
    tenant = await aliases.get_tenant(session, tenant_name)
    alias = await aliases.find_alias(session, tenant, alias_name)
    version_id = await aliases.target_version_id(session, alias)
    if version_id is None:
        raise aliases.NotServable(f"alias {alias_name!r} has no active version yet")
    return to_public(await lifecycle.load_version(session, version_id, lock=False))


async def history(session: AsyncSession, tenant_name: str, adapter_name: str) -> list[VersionPublic]:
    tenant = await aliases.get_tenant(session, tenant_name)
    adapter = await aliases.get_adapter(session, tenant, adapter_name)
    rows = (
        await session.exec(
            select(AdapterVersion).where(AdapterVersion.adapter_id == adapter.id).order_by(col(AdapterVersion.number))
        )
    ).all()
    names = dict((await session.exec(select(Dataset.id, Dataset.name).where(Dataset.tenant_id == tenant.id))).all())
    return [to_public(lifecycle.VersionContext(v, adapter, tenant, names.get(v.dataset_id))) for v in rows]


async def list_adapters(session: AsyncSession, tenant_name: str | None = None) -> list[AdapterPublic]:
    """Every adapter (of one tenant, or all) with its serving version and follow aliases: three queries
    whatever the count (`lpx top` asks for this every 30 s to name digests; one query per adapter was
    thousands a call on a large registry)."""
    query = select(Adapter, Tenant).join(Tenant, col(Adapter.tenant_id) == col(Tenant.id))
    if tenant_name is not None:
        await aliases.get_tenant(session, tenant_name)
        query = query.where(Tenant.name == tenant_name)
    rows = (await session.exec(query.order_by(Tenant.name, Adapter.name))).all()
    current_ids = [adapter.current_version_id for adapter, _ in rows if adapter.current_version_id is not None]
    current: dict[int, AdapterVersion] = {}
    if current_ids:
        found = await session.exec(select(AdapterVersion).where(col(AdapterVersion.id).in_(current_ids)))
        current = {version.id: version for version in found.all()}
    names: dict[int, list[str]] = {}
    if rows:
        follow = select(Alias.adapter_id, Alias.name).where(
            col(Alias.adapter_id).in_([adapter.id for adapter, _ in rows]), Alias.kind == AliasKind.FOLLOW
        )
        for adapter_id, name in (await session.exec(follow.order_by(Alias.name))).all():
            names.setdefault(adapter_id, []).append(name)
    result = []
    for adapter, tenant in rows:
        version = current.get(adapter.current_version_id) if adapter.current_version_id is not None else None
        result.append(
            AdapterPublic(
                tenant=tenant.name,
                name=adapter.name,
                latest_number=adapter.latest_number,
                current_version=version.number if version else None,
                current_digest=version.digest if version else None,
                aliases=names.get(adapter.id, []),
                created_at=adapter.created_at,
            )
        )
    return result


async def find_versions(
    session: AsyncSession, digest: str, tenant: str | None = None, adapter: str | None = None, number: int | None = None
) -> list[int]:
    """Version ids with this digest, optionally narrowed to one tenant/adapter/number."""
    query = (
        select(AdapterVersion.id)
        .join(Adapter, col(AdapterVersion.adapter_id) == col(Adapter.id))
        .join(Tenant, col(Adapter.tenant_id) == col(Tenant.id))
        .where(AdapterVersion.digest == digest)
    )
    if tenant is not None:
        query = query.where(Tenant.name == tenant)
    if adapter is not None:
        query = query.where(Adapter.name == adapter)
    if number is not None:
        query = query.where(AdapterVersion.number == number)
    return list((await session.exec(query.order_by(col(AdapterVersion.id)))).all())
