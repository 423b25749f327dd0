"""Usage metering: every answered request counted once per tenant, adapter and hour, from the results.

The registry reads the RESULTS stream through a durable consumer and writes one row per request id,
a pull's results in one `INSERT ... ON CONFLICT DO NOTHING`: a result delivered again (a redelivery,
or a second worker's answer to a re-routed request) adds nothing. Results without a tenant (the
gateway's own refusals of malformed submissions, results of workers older than this field) are not
usage and are skipped. When PostgreSQL is away the messages are NAKed with a delay and come back;
nothing is lost while the stream keeps them (24 h).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from nats.js.api import DeliverPolicy
from pydantic import ValidationError
from sqlalchemy import func
from sqlalchemy.dialects.postgresql import insert
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from libs.bus.consumer import PullConsumer, durable_pull
from libs.contracts import InferenceResult, subjects
from services.registry.context import RegistryContext
from services.registry.db import is_unavailable, transaction
from services.registry.deadletters import DeadLetters
from services.registry.models import Adapter, AdapterVersion, Tenant, UsageRecord

log = logging.getLogger(__name__)
RETRY_DELAY_S = 2.0
USAGE_GATHER_S = 0.25  # how long a pull of results waits for more to count in the same transaction


def hour_of(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def usage_row(result: InferenceResult, now: datetime) -> dict | None:
    """The row that counts `result`; None when it is nobody's usage (no tenant or base model)."""
    if not result.tenant or not result.base_model:
        return None
    return {
        "request_id": result.request_id,
        "tenant": result.tenant,
        "adapter_digest": result.adapter_digest,
        "base_model": result.base_model,
        "hour": hour_of(now),
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens,
        "ok": result.ok,
        "error_code": result.error.code if result.error else None,
        "worker_id": result.worker_id,
        "recorded_at": now,
    }


async def record(session: AsyncSession, results: list[InferenceResult], now: datetime | None = None) -> None:
    """Count `results` in one statement. A request counted before (or twice in `results`: a re-routed
    request's two answers in one pull) adds nothing. One statement with many parameter sets (an
    executemany, which asyncpg sends in one round trip): SQLAlchemy compiles it once and caches it,
    where a `values(...)` statement was compiled anew each time (most of the registry's CPU here)."""
    now = now or datetime.now(UTC)
    rows: dict[str, dict] = {}
    for result in results:
        row = usage_row(result, now)
        if row is not None:
            rows.setdefault(row["request_id"], row)  # the first answer met counts, as one at a time did
    if rows:
        await session.exec(insert(UsageRecord).on_conflict_do_nothing(), params=list(rows.values()))


@dataclass
class UsageRow:
    adapter: str  # `name-vN`, or the base model's name
    hour: datetime
    requests: int
    prompt_tokens: int
    completion_tokens: int
    errors: int


@dataclass
class UsageSummary:
    tenant: str
    since: datetime
    rows: list[UsageRow] = field(default_factory=list)

    def totals(self) -> dict[str, int]:
        keys = ("requests", "prompt_tokens", "completion_tokens", "errors")
        return {k: sum(getattr(row, k) for row in self.rows) for k in keys}


async def summary(session: AsyncSession, tenant: Tenant, since: datetime) -> UsageSummary:
    """Per adapter and hour since `since`, oldest first."""
    u = UsageRecord
    query = (
        select(
            u.adapter_digest,
            u.base_model,
            u.hour,
            func.count(),
            func.sum(u.prompt_tokens),
            func.sum(u.completion_tokens),
            func.count().filter(col(u.ok).is_(False)),
        )
        .where(u.tenant == tenant.name, u.hour >= hour_of(since))
        .group_by(u.adapter_digest, u.base_model, u.hour)
        .order_by(u.hour, u.adapter_digest)
    )
    grouped = (await session.exec(query)).all()
    names = await _version_names(session, tenant, {digest for digest, *_ in grouped if digest})
    rows = [
        UsageRow(names.get(digest, digest[:12]) if digest else base, hour, count, prompt or 0, completion or 0, errors)
        for digest, base, hour, count, prompt, completion, errors in grouped
    ]
    return UsageSummary(tenant.name, since, rows)


async def _version_names(session: AsyncSession, tenant: Tenant, digests: set[str]) -> dict[str, str]:
    if not digests:
        return {}
    query = (
        select(AdapterVersion.digest, Adapter.name, AdapterVersion.number)
        .join(Adapter, col(Adapter.id) == col(AdapterVersion.adapter_id))
        .where(Adapter.tenant_id == tenant.id, col(AdapterVersion.digest).in_(digests))
    )
    return {digest: f"{name}-v{number}" for digest, name, number in (await session.exec(query)).all()}


def since_of(hours: float) -> datetime:
    return datetime.now(UTC) - timedelta(hours=hours)


async def consume(link, ctx: RegistryContext, dead_letters: DeadLetters, stopping: asyncio.Event) -> None:
    """Count every result on the RESULTS stream, through the one pull loop (libs.bus.consumer)."""
    policy = DeliverPolicy.NEW if ctx.settings.usage_deliver_policy == "new" else DeliverPolicy.ALL
    sub = await durable_pull(
        link,
        subjects.RESULTS_STREAM,
        subjects.RESULTS_ALL,
        ctx.settings.usage_durable,
        ack_wait=30,
        deliver_policy=policy,
    )

    async def room() -> int:
        return 32

    async def deliver(msgs: list) -> None:
        parsed = [(msg, result) for msg in msgs if (result := await _parsed(dead_letters, msg)) is not None]
        if parsed:
            await _count(ctx, dead_letters, parsed)

    try:
        # Gathered: metering is not on anyone's path, and a delivery's results are counted in one
        # transaction (_count), so results a few ms apart no longer cost one each.
        gathering = PullConsumer(sub, "usage", room=room, deliver=deliver, max_batch=32, gather_s=USAGE_GATHER_S)
        await gathering.run(stopping)
    finally:  # nobody reads its queue now: a drain would wait on it
        with contextlib.suppress(Exception):
            await sub.unsubscribe()


async def _parsed(dead_letters: DeadLetters, msg) -> InferenceResult | None:
    """The result in `msg`; a malformed one is dead-lettered (and acked) and None."""
    try:
        return InferenceResult.model_validate_json(msg.data)
    except ValidationError as exc:
        await dead_letters.send(
            msg.subject, f"usage: malformed InferenceResult: {exc.errors()[:1]}", msg.data, msg.headers
        )
        await msg.ack()
        return None


async def _count(ctx: RegistryContext, dead_letters: DeadLetters, batch: list[tuple]) -> None:
    """Count a pull's results in one transaction (not one per result: under load that was the
    registry's main CPU cost), then ack them. PostgreSQL away: every one NAKed with a delay, counted
    on redelivery. Any other failure: counted one by one, so only the result that cannot be recorded
    is dead-lettered."""
    try:
        async with transaction(ctx.sessions) as session:
            await record(session, [result for _, result in batch])
    except Exception as exc:
        if is_unavailable(exc):
            log.warning("database unavailable; usage of %d results will be counted on redelivery", len(batch))
            for msg, _ in batch:
                await msg.nak(delay=RETRY_DELAY_S)
            return
        if len(batch) > 1:
            for one in batch:
                await _count(ctx, dead_letters, [one])
            return
        msg, _ = batch[0]
        await dead_letters.send(msg.subject, f"usage could not be recorded: {exc}", msg.data, msg.headers)
    for msg, _ in batch:
        await msg.ack()
