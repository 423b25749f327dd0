"""What the eval gate asks the registry before it evaluates a version (subjects.EVAL_CONTEXT,
request/reply, queue group shared with the resolver): the version's status and reference, its base
model's shapes, where the eval cases are, the tenant's threshold and value check (minimum lift,
system prompt) and the regression baseline (the
version the adapter's aliases serve now). With `claim`, a pending version moves to `evaluating`.

The eval set is the eval split of the dataset the version was trained from; a version pushed by
hand is evaluated on the tenant's newest dataset that has eval cases. No eval set: the reply says so
and the gate rejects (nothing activates by default).
"""

from __future__ import annotations

import logging

from faststream.nats.annotations import NatsMessage
from pydantic import ValidationError
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from libs.contracts import DatasetRef, EvalContextReply, EvalContextRequest, subjects
from libs.contracts.parsing import first_error
from services.registry import aliases, lifecycle
from services.registry.context import RegistryContext
from services.registry.db import is_unavailable, transaction
from services.registry.deadletters import DeadLetters
from services.registry.deadlines import answer_in_time
from services.registry.errors import RegistryError
from services.registry.models import AdapterVersion, BaseModelRow, Dataset
from services.registry.resolver import QUEUE_GROUP

log = logging.getLogger(__name__)


async def eval_context(ctx: RegistryContext, request: EvalContextRequest) -> EvalContextReply:
    """The reply for one well-formed request; never raises."""
    try:
        async with transaction(ctx.sessions) as session:
            reply = await _context(session, request)
        if request.claim:
            ctx.wake_relay()
        return reply
    except RegistryError as exc:
        return EvalContextReply(found=False, code=exc.code, error=exc.message)
    except Exception as exc:
        if not is_unavailable(exc):
            log.exception("eval context failed for %s/%s v%s", request.tenant, request.adapter, request.version)
        return EvalContextReply(found=False, code="unavailable", error=f"registry unavailable: {type(exc).__name__}")


async def _context(session: AsyncSession, request: EvalContextRequest) -> EvalContextReply:
    tenant = await aliases.get_tenant(session, request.tenant)
    alias = await aliases.find_alias(session, tenant, aliases.pinned_name(request.adapter, request.version))
    vctx = await lifecycle.load_version(session, alias.version_id, lock=request.claim)
    if request.claim and vctx.version.status == lifecycle.S.PENDING:
        await lifecycle.begin_evaluation(session, vctx)
    base = (await session.exec(select(BaseModelRow).where(BaseModelRow.id == vctx.version.base_model_id))).one()
    active = await _baseline(session, vctx)
    return EvalContextReply(
        found=True,
        status=vctx.version.status,
        ref=vctx.ref(),
        base_spec=dict(base.spec),
        dataset=await _eval_set(session, vctx),
        threshold=tenant.eval_threshold,
        active_version=active.number if active else None,
        active_ref=lifecycle.VersionContext(active, vctx.adapter, vctx.tenant).ref() if active else None,
        active_report=active.eval_report if active else None,
        min_lift=tenant.min_lift,
        system_prompt=tenant.system_prompt,
    )


async def _eval_set(session: AsyncSession, vctx: lifecycle.VersionContext) -> DatasetRef | None:
    if vctx.version.dataset_id is not None:
        query = select(Dataset).where(Dataset.id == vctx.version.dataset_id, Dataset.eval_cases > 0)
    else:
        query = (
            select(Dataset)
            .where(Dataset.tenant_id == vctx.tenant.id, Dataset.eval_cases > 0)
            .order_by(col(Dataset.created_at).desc(), col(Dataset.id).desc())
        )
    row = (await session.exec(query)).first()
    if row is None:
        return None
    return DatasetRef(
        name=row.name,
        digest=row.digest,
        object_key=row.object_key,
        train_examples=row.train_examples,
        eval_cases=row.eval_cases,
    )


async def _baseline(session: AsyncSession, vctx: lifecycle.VersionContext) -> AdapterVersion | None:
    current_id = vctx.adapter.current_version_id
    if current_id is None or current_id == vctx.version.id:
        return None
    return (await session.exec(select(AdapterVersion).where(AdapterVersion.id == current_id))).one()


def register(broker, ctx: RegistryContext, dead_letters: DeadLetters) -> None:
    @broker.subscriber(subjects.EVAL_CONTEXT, queue=QUEUE_GROUP)
    async def on_eval_context(msg: NatsMessage) -> EvalContextReply:
        try:
            request = EvalContextRequest.model_validate_json(msg.body)
        except ValidationError as exc:
            reason = f"malformed EvalContextRequest: {first_error(exc)}"
            await dead_letters.send(subjects.EVAL_CONTEXT, reason, msg.body, msg.headers)
            return EvalContextReply(found=False, error=reason, code="bad_request")
        # Not cut off mid-way: with claim=True it writes (the claim), see answer_in_time.
        work = eval_context(ctx, request)
        return await answer_in_time(ctx.expired, subjects.EVAL_CONTEXT, msg.headers, work, cut_off=False, link=ctx.link)
