"""The registry side of the eval gate: EvaluationResult messages on subjects.EVALUATED (stored in the
events stream, consumed through a durable consumer) activate or reject versions.

- A result for a version that awaits a verdict (pending or evaluating) is recorded through the
  lifecycle; a redelivered result (same event id) is a no-op.
- A result nobody can apply (malformed, unknown digest, version already decided) is acknowledged
  and dead-lettered with the reason, never retried forever.
- When the database is unavailable the message is NAKed with a delay, so it comes back later
  instead of being lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field

from nats.js.api import DeliverPolicy
from pydantic import ValidationError

from libs.bus.consumer import PullConsumer, durable_pull
from libs.contracts import EvaluationResult, subjects
from services.registry import audit, lifecycle, versions
from services.registry.context import RegistryContext
from services.registry.db import is_unavailable, transaction
from services.registry.deadletters import DeadLetters

log = logging.getLogger(__name__)
RETRY_DELAY_S = 2.0
EVAL_GATE = audit.Actor("eval-gate", audit.SERVICE)  # who a verdict read from NATS is recorded as


@dataclass
class VerdictOutcome:
    applied: list[int] = field(default_factory=list)  # version numbers the verdict decided
    repeated: int = 0  # versions that had already recorded this very result
    refused: list[str] = field(default_factory=list)  # why the others could not take it


async def apply_verdict(ctx: RegistryContext, result: EvaluationResult) -> VerdictOutcome:
    outcome = VerdictOutcome()
    async with transaction(ctx.sessions) as session:
        ids = await versions.find_versions(session, result.digest, result.tenant, result.adapter, result.version)
        for version_id in ids:
            vctx = await lifecycle.load_version(session, version_id)
            label = f"{vctx.tenant.name}/{vctx.adapter.name} v{vctx.version.number}"
            if vctx.version.eval_event_id == result.event_id:
                outcome.repeated += 1
            elif vctx.version.status not in lifecycle.AWAITING_VERDICT:
                outcome.refused.append(f"{label} is already {vctx.version.status}")
            else:
                before = {"status": vctx.version.status}
                await lifecycle.record_verdict(
                    session,
                    vctx,
                    passed=result.passed,
                    reason=result.reason,
                    report=result.report,
                    eval_event_id=result.event_id,
                )
                after = {"status": vctx.version.status, "passed": result.passed, "reason": result.reason}
                with audit.acting(EVAL_GATE, request_id=result.event_id):
                    target = f"{vctx.adapter.name}-v{vctx.version.number}"
                    audit.record(
                        session, "version.verdict", target, tenant=vctx.tenant.name, before=before, after=after
                    )
                outcome.applied.append(vctx.version.number)
    if not ids:
        outcome.refused.append(f"no version with digest {result.digest[:12]} matches this result")
    if outcome.applied:
        ctx.wake_relay()
    return outcome


async def consume(link, ctx: RegistryContext, dead_letters: DeadLetters, stopping: asyncio.Event) -> None:
    """Apply the eval gate's verdicts, one at a time, through the one pull loop (libs.bus.consumer)."""
    policy = DeliverPolicy.NEW if ctx.settings.eval_deliver_policy == "new" else DeliverPolicy.ALL
    sub = await durable_pull(
        link, subjects.EVENTS_STREAM, subjects.EVALUATED, ctx.settings.eval_durable, ack_wait=30, deliver_policy=policy
    )

    async def room() -> int:
        return 1

    async def deliver(msgs: list) -> None:
        for msg in msgs:
            await on_evaluated(ctx, dead_letters, msg)

    try:
        await PullConsumer(sub, "eval verdicts", room=room, deliver=deliver).run(stopping)
    finally:  # nobody reads its queue now: a drain would wait on it
        with contextlib.suppress(Exception):
            await sub.unsubscribe()


async def on_evaluated(ctx: RegistryContext, dead_letters: DeadLetters, msg) -> None:
    try:
        result = EvaluationResult.model_validate_json(msg.data)
    except ValidationError as exc:
        await dead_letters.send(
            subjects.EVALUATED, f"malformed EvaluationResult: {exc.errors()[:1]}", msg.data, msg.headers
        )
        await msg.ack()
        return
    try:
        outcome = await apply_verdict(ctx, result)
    except Exception as exc:
        if is_unavailable(exc):
            log.warning("database unavailable; verdict %s will be redelivered", result.event_id)
            await msg.nak(delay=RETRY_DELAY_S)
            return
        await dead_letters.send(subjects.EVALUATED, f"verdict could not be applied: {exc}", msg.data, msg.headers)
        await msg.ack()
        return
    if not outcome.applied and not outcome.repeated:
        await dead_letters.send(
            subjects.EVALUATED, "verdict ignored: " + "; ".join(outcome.refused), msg.data, msg.headers
        )
    await msg.ack()
