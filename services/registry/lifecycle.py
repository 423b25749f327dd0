"""The version lifecycle as an explicit state machine.

    pending --> evaluating --> active --> retired
                     \\
                      +------> rejected

- Only a passing evaluation activates a version. The one exception is an admin override, which is
  explicit (its own function and endpoint, admin token required) and recorded (who, when, why) in the
  version row and in the "activated" event. An override may activate a pending, evaluating or
  rejected version (the point of an override is a false negative of the gate).
- Activation moves the adapter's follow-aliases (`<adapter>` and custom ones) to the new version
  when it is newer than the one they serve; the previously served version stays `active` (not
  retired), so a rollback can move the aliases back to it and its pinned alias keeps resolving.
  A verdict for an older version arriving late activates it without moving the aliases backwards.
- Retiring the version the follow-aliases serve is refused: roll back (or activate another version)
  first, so an alias never silently stops resolving.
- A re-evaluation request (`lpx adapter eval`) re-announces a version that awaits a verdict, or
  sends a rejected one back to pending (a false negative, or a fixed eval set); an active or retired
  version is not re-evaluated (push a new version instead).
- Every transition writes its event(s) to the outbox in the caller's transaction.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from libs.contracts import AdapterEvent, AdapterEventKind, AdapterRef
from services.registry.errors import Conflict, NotFound
from services.registry.models import (
    Adapter,
    AdapterVersion,
    Alias,
    AliasKind,
    Dataset,
    Tenant,
    VersionStatus,
    utcnow,
)
from services.registry.outbox import enqueue

S = VersionStatus
TRANSITIONS: dict[VersionStatus, frozenset[VersionStatus]] = {
    S.PENDING: frozenset({S.EVALUATING}),
    S.EVALUATING: frozenset({S.ACTIVE, S.REJECTED}),
    S.ACTIVE: frozenset({S.RETIRED}),
    S.REJECTED: frozenset(),
    S.RETIRED: frozenset(),
}
OVERRIDE_FROM: frozenset[VersionStatus] = frozenset({S.PENDING, S.EVALUATING, S.REJECTED})
AWAITING_VERDICT: frozenset[VersionStatus] = frozenset({S.PENDING, S.EVALUATING})


class TransitionRefused(Conflict):
    code = "transition_refused"


def check_transition(current: VersionStatus, target: VersionStatus, *, override: bool = False) -> None:
    if target in TRANSITIONS[current]:
        return
    if override and target == S.ACTIVE and current in OVERRIDE_FROM:
        return
    allowed = ", ".join(sorted(TRANSITIONS[current])) or "none (terminal)"
    how = " even with an admin override" if override else ""
    raise TransitionRefused(f"a {current} version cannot become {target}{how}; allowed from {current}: {allowed}")


@dataclass
class VersionContext:
    """One version with its adapter and tenant, the rows every transition needs."""

    version: AdapterVersion
    adapter: Adapter
    tenant: Tenant
    dataset_name: str | None = None  # the dataset the version was trained from, when recorded

    def ref(self) -> AdapterRef:
        v = self.version
        return AdapterRef(
            digest=v.digest, object_key=v.object_key, base_model=v.base_model, rank=v.rank, size_bytes=v.size_bytes
        )

    def event(self, kind: AdapterEventKind, detail: str = "", alias: str | None = None) -> AdapterEvent:
        v = self.version
        return AdapterEvent(
            kind=kind,
            tenant=self.tenant.name,
            adapter=self.adapter.name,
            digest=v.digest,
            alias=alias,
            base_model=v.base_model,
            detail=detail,
            version=v.number,
            ref=self.ref(),
        )


@dataclass(frozen=True)
class Override:
    actor: str
    reason: str


async def load_version(session: AsyncSession, version_id: int, *, lock: bool = True) -> VersionContext:
    """Load (and by default lock: transitions of one adapter serialise) a version with its parents."""
    adapter_query = (
        select(Adapter)
        .join(AdapterVersion, col(AdapterVersion.adapter_id) == col(Adapter.id))
        .where(AdapterVersion.id == version_id)
    )
    version_query = select(AdapterVersion).where(AdapterVersion.id == version_id)
    if lock:
        adapter_query, version_query = adapter_query.with_for_update(of=Adapter), version_query.with_for_update()
    fresh = {"populate_existing": True}  # rows read under the lock win over anything cached in the session
    adapter = (await session.exec(adapter_query.execution_options(**fresh))).first()
    if adapter is None:
        raise NotFound(f"version id {version_id} not found")
    version = (await session.exec(version_query.execution_options(**fresh))).one()
    tenant = (await session.exec(select(Tenant).where(Tenant.id == adapter.tenant_id))).one()
    dataset = None
    if version.dataset_id is not None:
        dataset = (await session.exec(select(Dataset.name).where(Dataset.id == version.dataset_id))).one()
    return VersionContext(version, adapter, tenant, dataset)


def _move(ctx: VersionContext, target: VersionStatus, reason: str = "") -> None:
    ctx.version.status = target
    ctx.version.status_reason = reason
    ctx.version.status_changed_at = utcnow()


async def begin_evaluation(session: AsyncSession, ctx: VersionContext) -> None:
    check_transition(ctx.version.status, S.EVALUATING)
    _move(ctx, S.EVALUATING)
    enqueue(session, ctx.event(AdapterEventKind.EVALUATING))


async def reject(session: AsyncSession, ctx: VersionContext, reason: str, report: dict | None = None) -> None:
    check_transition(ctx.version.status, S.REJECTED)
    _move(ctx, S.REJECTED, reason or "evaluation failed")
    ctx.version.eval_report = report
    enqueue(session, ctx.event(AdapterEventKind.REJECTED, detail=ctx.version.status_reason))


async def activate(
    session: AsyncSession, ctx: VersionContext, *, report: dict | None = None, override: Override | None = None
) -> None:
    check_transition(ctx.version.status, S.ACTIVE, override=override is not None)
    detail = "evaluation passed"
    if override is not None:
        ctx.version.override_by, ctx.version.override_reason = override.actor, override.reason
        ctx.version.override_at = utcnow()
        detail = f"admin override by {override.actor}: {override.reason}"
    _move(ctx, S.ACTIVE, detail)
    if report is not None:
        ctx.version.eval_report = report
    enqueue(session, ctx.event(AdapterEventKind.ACTIVATED, detail=detail))
    if await _serves_older_version(session, ctx):
        await point_follow_aliases(session, ctx, reason=f"version {ctx.version.number} activated")


async def retire(session: AsyncSession, ctx: VersionContext, reason: str = "") -> None:
    if ctx.adapter.current_version_id == ctx.version.id:
        raise TransitionRefused(
            f"version {ctx.version.number} of {ctx.adapter.name} is what its aliases serve; "
            f"roll back or activate another version before retiring it"
        )
    check_transition(ctx.version.status, S.RETIRED)
    _move(ctx, S.RETIRED, reason or "retired")
    enqueue(session, ctx.event(AdapterEventKind.RETIRED, detail=ctx.version.status_reason))


REEVALUATE_FROM: frozenset[VersionStatus] = frozenset({S.PENDING, S.EVALUATING, S.REJECTED})


async def request_evaluation(session: AsyncSession, ctx: VersionContext, requested_by: str) -> None:
    """Ask the eval gate to (re-)evaluate this version: an `eval_requested` event it consumes."""
    status = ctx.version.status
    if status not in REEVALUATE_FROM:
        raise TransitionRefused(
            f"version {ctx.version.number} is {status}; only pending, evaluating or rejected "
            f"versions are (re-)evaluated - push a new version instead"
        )
    if status != S.PENDING:
        _move(ctx, S.PENDING, f"re-evaluation requested by {requested_by}")
    ctx.version.eval_event_id = None
    enqueue(
        session,
        ctx.event(
            AdapterEventKind.EVAL_REQUESTED,
            detail=f"requested by {requested_by}",
            alias=f"{ctx.adapter.name}-v{ctx.version.number}",
        ),
    )


async def record_verdict(
    session: AsyncSession, ctx: VersionContext, *, passed: bool, reason: str, report: dict, eval_event_id: str
) -> None:
    """An evaluation result. A verdict may arrive for a version nobody marked `evaluating` (the gate
    does not have to announce that it started); then both steps are recorded, in order."""
    if ctx.version.status == S.PENDING:
        await begin_evaluation(session, ctx)
    ctx.version.eval_event_id = eval_event_id
    if passed:
        await activate(session, ctx, report=report)
    else:
        await reject(session, ctx, reason, report)


async def point_follow_aliases(session: AsyncSession, ctx: VersionContext, reason: str) -> None:
    """Make the adapter's follow-aliases serve ctx.version; one alias_moved event per alias."""
    if ctx.version.status != S.ACTIVE:
        raise TransitionRefused(
            f"aliases can only point at an active version; version {ctx.version.number} is {ctx.version.status}"
        )
    ctx.adapter.current_version_id = ctx.version.id
    session.add(ctx.adapter)
    follow = select(Alias.name).where(Alias.adapter_id == ctx.adapter.id, Alias.kind == AliasKind.FOLLOW)
    for name in (await session.exec(follow.order_by(Alias.name))).all():
        enqueue(session, ctx.event(AdapterEventKind.ALIAS_MOVED, detail=reason, alias=name))


async def _serves_older_version(session: AsyncSession, ctx: VersionContext) -> bool:
    current_id = ctx.adapter.current_version_id
    if current_id is None:
        return True
    current = (await session.exec(select(AdapterVersion.number).where(AdapterVersion.id == current_id))).one()
    return current < ctx.version.number
