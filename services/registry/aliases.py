"""Aliases and resolution.

`<adapter>-v<N>` is pinned to version N; `<adapter>` (and any name the tenant adds) follows the
adapter's current active version. Resolution answers only with active versions: a pinned alias of a
pending, rejected or retired version fails closed with a reason, never with some other version.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from libs.contracts import AdapterEventKind, AdapterRef
from services.registry import audit, lifecycle
from services.registry.errors import Conflict, NotFound
from services.registry.models import Adapter, AdapterVersion, Alias, AliasKind, AliasPublic, Tenant, VersionStatus
from services.registry.outbox import enqueue
from services.registry.validation import PINNED_SUFFIX, check_name


class NotServable(Conflict):
    code = "not_active"


def pinned_name(adapter: str, number: int) -> str:
    return f"{adapter}-v{number}"


@dataclass(frozen=True)
class Resolved:
    tenant: str
    alias: str
    adapter: str
    version: int
    ref: AdapterRef


async def get_tenant(session: AsyncSession, name: str) -> Tenant:
    tenant = (await session.exec(select(Tenant).where(Tenant.name == name))).first()
    if tenant is None:
        raise NotFound(f"unknown tenant {name!r}", code="unknown_tenant")
    return tenant


async def get_adapter(session: AsyncSession, tenant: Tenant, name: str, *, lock: bool = False) -> Adapter:
    query = select(Adapter).where(Adapter.tenant_id == tenant.id, Adapter.name == name)
    if lock:
        query = query.with_for_update().execution_options(populate_existing=True)
    adapter = (await session.exec(query)).first()
    if adapter is None:
        raise NotFound(f"tenant {tenant.name!r} has no adapter {name!r}", code="unknown_adapter")
    return adapter


async def find_alias(session: AsyncSession, tenant: Tenant, name: str) -> Alias:
    alias = (await session.exec(select(Alias).where(Alias.tenant_id == tenant.id, Alias.name == name))).first()
    if alias is None:
        raise NotFound(f"tenant {tenant.name!r} has no alias {name!r}", code="unknown_alias")
    return alias


async def target_version_id(session: AsyncSession, alias: Alias) -> int | None:
    if alias.kind == AliasKind.PINNED:
        return alias.version_id
    return (await session.exec(select(Adapter.current_version_id).where(Adapter.id == alias.adapter_id))).one()


async def resolve(session: AsyncSession, tenant_name: str, alias_name: str) -> Resolved:
    tenant = await get_tenant(session, tenant_name)
    alias = await find_alias(session, tenant, alias_name)
    version_id = await target_version_id(session, alias)
    if version_id is None:
        raise NotServable(
            f"alias {alias_name!r} of tenant {tenant_name!r} has no active version yet "
            f"(it is served once a version passes evaluation)"
        )
    ctx = await lifecycle.load_version(session, version_id, lock=False)
    if ctx.version.status != VersionStatus.ACTIVE:
        why = f": {ctx.version.status_reason}" if ctx.version.status_reason else ""
        raise NotServable(
            f"alias {alias_name!r} points at version {ctx.version.number} of {ctx.adapter.name}, "
            f"which is {ctx.version.status}{why}"
        )
    return Resolved(tenant_name, alias_name, ctx.adapter.name, ctx.version.number, ctx.ref())


async def add_pinned(session: AsyncSession, tenant: Tenant, adapter: Adapter, version: AdapterVersion) -> Alias:
    alias = Alias(
        tenant_id=tenant.id,
        name=pinned_name(adapter.name, version.number),
        kind=AliasKind.PINNED,
        adapter_id=adapter.id,
        version_id=version.id,
    )
    session.add(alias)
    return alias


async def add_follow(session: AsyncSession, tenant: Tenant, adapter: Adapter, name: str) -> Alias:
    """A follow-alias: the adapter's own name at creation, or a name the tenant chooses."""
    check_name("alias", name)
    if PINNED_SUFFIX.fullmatch(name):
        raise Conflict(f"alias {name!r}: names ending in -v<number> are reserved for pinned aliases", code="bad_name")
    taken = (await session.exec(select(Alias).where(Alias.tenant_id == tenant.id, Alias.name == name))).first()
    if taken is not None:
        raise Conflict(f"tenant {tenant.name!r} already has an alias {name!r}", code="alias_exists")
    alias = Alias(tenant_id=tenant.id, name=name, kind=AliasKind.FOLLOW, adapter_id=adapter.id)
    session.add(alias)
    await session.flush()
    if adapter.current_version_id is not None:
        ctx = await lifecycle.load_version(session, adapter.current_version_id)
        enqueue(session, ctx.event(AdapterEventKind.ALIAS_MOVED, detail="alias created", alias=name))
    return alias


async def rollback(session: AsyncSession, tenant: Tenant, adapter_name: str, to_number: int | None = None) -> int:
    """Move the follow-aliases back to an earlier active version (the newest one before the current one,
    or `to_number`). Returns the version number they serve now."""
    adapter = await get_adapter(session, tenant, adapter_name, lock=True)
    if adapter.current_version_id is None:
        raise Conflict(f"{adapter_name!r} has no active version to roll back from", code="nothing_to_roll_back")
    current = (await session.exec(select(AdapterVersion).where(AdapterVersion.id == adapter.current_version_id))).one()
    query = select(AdapterVersion).where(
        AdapterVersion.adapter_id == adapter.id,
        AdapterVersion.status == VersionStatus.ACTIVE,
        col(AdapterVersion.number) < current.number,
    )
    if to_number is not None:
        query = query.where(AdapterVersion.number == to_number)
    target = (await session.exec(query.order_by(col(AdapterVersion.number).desc()))).first()
    if target is None:
        which = f"version {to_number}" if to_number is not None else "an earlier version"
        raise Conflict(
            f"cannot roll back {adapter_name!r} from version {current.number}: {which} is not an "
            f"active version older than the current one",
            code="nothing_to_roll_back",
        )
    ctx = await lifecycle.load_version(session, target.id)
    await lifecycle.point_follow_aliases(session, ctx, reason=f"rollback from version {current.number}")
    audit.record(
        session,
        "adapter.rolled_back",
        adapter_name,
        tenant=tenant.name,
        before={"version": current.number},
        after={"version": target.number},
    )
    return target.number


async def list_aliases(session: AsyncSession, tenant: Tenant) -> list[AliasPublic]:
    rows = (
        await session.exec(
            select(Alias, Adapter)
            .join(Adapter, col(Alias.adapter_id) == col(Adapter.id))
            .where(Alias.tenant_id == tenant.id)
            .order_by(Alias.name)
        )
    ).all()
    result = []
    for alias, adapter in rows:
        version_id = alias.version_id if alias.kind == AliasKind.PINNED else adapter.current_version_id
        version = None
        if version_id is not None:
            version = (await session.exec(select(AdapterVersion).where(AdapterVersion.id == version_id))).one()
        result.append(
            AliasPublic(
                tenant=tenant.name,
                name=alias.name,
                kind=alias.kind,
                adapter=adapter.name,
                version=version.number if version else None,
                digest=version.digest if version else None,
            )
        )
    return result
