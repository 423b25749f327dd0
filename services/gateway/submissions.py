"""Async submission over NATS: a tenant publishes SubmitRequest on its own `subjects.submit(tenant)`
(JetStream work queue, Nats-Msg-Id `<tenant>:<request id>`); one durable consumer shared by every
gateway replica takes them. The broker lets a tenant's credential publish on its own subject only, and
the gateway refuses a message whose API key belongs to another tenant than the subject names.

Each submission is authenticated, resolved and dispatched like an HTTP request, under an internal work
id (`sub-<tenant>-<request id>`: two tenants may pick the same request id), so that the gateway sees the
worker's result first and checks the applied digest before anything reaches the caller. The checked
result (or the error) is published to `subjects.tenant_results(tenant, request_id)` in the RESULTS
stream with Nats-Msg-Id `result-<tenant>-<request id>`: only that tenant's credential can read it.
With `stream`, text deltas are relayed on `subjects.tenant_tokens(tenant, request_id)`.

Limits and tiers: a submission is counted against its tenant's limits like an HTTP request, but over
a limit it waits here until the limit allows it (a bounded queue per tenant, `submit_tenant_queue`;
waiting submissions do not hold one of the consumer's places), and only when that queue is full it
ends with a `rate_limit_exceeded` result. It is never refused early for an overloaded pool: it waits
for its turn. Its tier (`batch` by default) decides its place in a full pool: interactive work first,
batch work fills what interactive traffic leaves.

Resubmitting an id never generates twice: JetStream drops a duplicate inside its window, a request in
flight here is not started again, a stored result is not regenerated, and a stored internal result is
reused instead of asking a worker again. The submission is acked only after its result is stored, so a
gateway crash leads to redelivery, never to loss.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict

from pydantic import ValidationError

from libs.bus.consumer import PullConsumer, durable_pull, kept_in_progress
from libs.bus.dead_letters import dead_letter
from libs.bus.retry import is_transient, last_message, publish_retrying
from libs.contracts import ErrorInfo, InferenceResult, SubmitRequest, TokenDelta, subjects
from libs.contracts.parsing import first_error, request_id_of
from libs.telemetry import extract_context, inject_headers
from services.gateway import errors, logprobs
from services.gateway.dispatch import check_applied
from services.gateway.errors import GatewayError
from services.gateway.limits import RateLimited, estimate_tokens

log = logging.getLogger(__name__)
SERVICE = "gateway"
ACK_WAIT_S = 30.0
# How long a result publish is retried (broker away) before the submission is left for redelivery.
RESULT_PUBLISH_RETRY_S = 120.0


def internal_id(tenant: str, request_id: str) -> str:
    return f"sub-{tenant}-{request_id}"


class SubmissionConsumer:
    def __init__(self, gateway, *, durable: str, concurrency: int = 256) -> None:
        self.gateway = gateway
        self.durable = durable
        self.concurrency = concurrency
        self.active: set[str] = set()
        self.waiting_for_limits: dict[str, int] = defaultdict(int)  # tenant -> submissions waiting here
        self._slots = asyncio.Semaphore(concurrency)
        self._tasks: set[asyncio.Task] = set()
        self._loop_task: asyncio.Task | None = None
        self.sub = None
        self.duplicates = 0

    async def start(self) -> None:
        self.sub = await durable_pull(
            self.gateway.link,
            subjects.SUBMIT_STREAM,
            subjects.SUBMIT_ALL,
            self.durable,
            ack_wait=ACK_WAIT_S,
            max_ack_pending=self.concurrency * 2,
        )
        pulling = PullConsumer(self.sub, "submissions", room=self._room, deliver=self._start, max_batch=64)
        self._loop_task = asyncio.create_task(pulling.run(), name="submissions")

    async def stop(self) -> None:
        if self._loop_task:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.sub is not None:
            # A pull subscription's queue keeps what arrives after the last fetch (status replies of
            # expired pulls); nobody reads it now, so the connection's drain would wait on it until its
            # time limit and cancel it ("_GatheringFuture exception was never retrieved" at every stop).
            with contextlib.suppress(Exception):
                await self.sub.unsubscribe()

    async def _room(self) -> int:
        return self.concurrency - len(self._tasks)

    async def _start(self, msgs: list) -> None:
        for msg in msgs:
            await self._slots.acquire()
            task = asyncio.create_task(self._run(msg))
            self._tasks.add(task)
            task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        self._slots.release()

    async def _run(self, msg) -> None:
        try:
            await self.handle(msg)
        except Exception as exc:
            if is_transient(exc):  # the broker is away: expected, no traceback
                log.warning(
                    "submission not finished while the broker is unavailable (%s); it will be redelivered",
                    type(exc).__name__,
                )
            else:
                log.exception("submission handling failed; it will be redelivered", extra={"subject": msg.subject})

    async def handle(self, msg) -> None:
        g = self.gateway
        tenant = subjects.submitter_of(msg.subject)
        if tenant is None:
            await self._dead_letter(msg, f"not a tenant's submission subject: {msg.subject!r}", tenant=None)
            return
        try:
            submit = SubmitRequest.model_validate_json(msg.data)
        except ValidationError as exc:
            await self._dead_letter(msg, f"invalid SubmitRequest: {first_error(exc)}", tenant=tenant)
            return
        rid = submit.request_id
        result_subject = subjects.tenant_results(tenant, rid)
        if (tenant, rid) in self.active or await self._stored(result_subject) is not None:
            self.duplicates += 1
            g.metrics.submissions.add(1, {"outcome": "duplicate"})
            await msg.ack()
            return
        self.active.add((tenant, rid))
        try:
            async with kept_in_progress(msg, ACK_WAIT_S):  # not redelivered while it waits for the pool
                with g.tracer.start_as_current_span(
                    "gateway.submission",
                    context=extract_context(msg.headers),
                    attributes={"lpx.request_id": rid, "lpx.tenant": tenant},
                ):
                    result = await self._execute(submit, tenant)
                await publish_retrying(
                    g.js,
                    result_subject,
                    result.model_dump_json().encode(),
                    headers=inject_headers({"Nats-Msg-Id": f"result-{tenant}-{rid}"}),
                    give_up_at=time.time() + RESULT_PUBLISH_RETRY_S,
                )
                g.metrics.submissions.add(1, {"outcome": "ok" if result.ok else result.error.code})
                await msg.ack()
        finally:
            self.active.discard((tenant, rid))

    async def _execute(self, submit: SubmitRequest, tenant: str) -> InferenceResult:
        g = self.gateway
        rid = submit.request_id
        work_id = internal_id(tenant, rid)
        try:
            # Generated before a gateway restart, for whichever gateway dispatched it then.
            stored = await self._stored(subjects.result_lookup(work_id, g.settings.gateway_id))
            if stored is not None:
                prepared = await self._prepare(submit, tenant)
                checked = check_applied(
                    InferenceResult.model_validate_json(stored),
                    prepared.expected_digest,
                    tenant=prepared.tenant,
                    metrics=g.metrics,
                )
            else:
                checked = await self._generate(submit, tenant, work_id)
        except GatewayError as exc:
            return InferenceResult(
                request_id=rid, worker_id="gateway", ok=False, error=ErrorInfo(code=exc.code, message=exc.message)
            )
        # The worker's answer under the submission's id. Usage metering counted the worker's answer
        # already (under the work id): this copy names no tenant, so it is not counted twice.
        return checked.model_copy(update={"request_id": rid, "tenant": None})

    async def _prepare(self, submit: SubmitRequest, tenant: str):
        """Key check and resolution, and the key's tenant must be the one whose subject carried the
        message: a tenant's NATS credential with another tenant's API key is refused (403)."""
        prepared = await self.gateway.prepare(submit.api_key, submit.model)
        if prepared.tenant != tenant:
            raise GatewayError(
                403,
                f"the API key does not belong to tenant {tenant!r}, whose submission subject carried this request",
                "permission_denied",
            )
        return prepared

    async def _generate(self, submit: SubmitRequest, tenant: str, work_id: str) -> InferenceResult:
        g = self.gateway
        timeout = min(submit.timeout_s or g.settings.request_timeout_s, 24 * 3600)
        deadline = submit.submitted_at + timeout
        prepared = await self._prepare(submit, tenant)
        prompt_chars = g.check_prompt(submit.prompt, submit.messages)
        sampling = submit.sampling
        if sampling.logprobs is not None and (why := logprobs.check_budget(sampling.max_tokens, sampling.logprobs)):
            raise errors.bad_request(why, "sampling.max_tokens")
        estimate = estimate_tokens(prompt_chars, sampling.max_tokens)
        prepared, ticket = await self._admit(submit, tenant, prepared, estimate, deadline)
        result = None
        try:
            result = await self._run_job(submit, tenant, work_id, prepared, deadline)
            return result
        finally:
            g.limiter.release(ticket, result.prompt_tokens + result.completion_tokens if result else None)

    async def _run_job(
        self, submit: SubmitRequest, tenant: str, work_id: str, prepared, deadline: float
    ) -> InferenceResult:
        g = self.gateway
        job = await g.dispatch(
            prepared,
            request_id=work_id,
            prompt=submit.prompt,
            messages=submit.messages,
            sampling=submit.sampling,
            deadline=deadline,
            stream=submit.stream,
            interactive=submit.tier == "interactive",
            refuse_early=False,
        )
        if not submit.stream:
            return await g.dispatcher.wait(job, deadline)
        index = 0
        async for event in g.dispatcher.events(job, deadline):
            if isinstance(event, InferenceResult):
                return event
            delta = TokenDelta(request_id=submit.request_id, index=index, text=event.text, logprobs=event.logprobs)
            await g.nc.publish(subjects.tenant_tokens(tenant, submit.request_id), delta.model_dump_json().encode())
            index += 1
        raise GatewayError(502, "the stream ended without a result", "engine_error")

    async def _admit(self, submit: SubmitRequest, tenant: str, prepared, estimate: int, deadline: float):
        """(prepared, ticket) once the tenant's limits allow the submission. Over a limit it waits in
        its tenant's bounded queue, the key and model checked again after each wait (revoked meanwhile:
        401); refused when the queue is full, when it can never fit, or at its deadline."""
        g = self.gateway
        while True:
            try:
                return prepared, g.limiter.admit(prepared.tenant, prepared.limits, estimate)
            except RateLimited as exc:
                tenant = prepared.tenant
                if not exc.retryable:
                    raise
                waiting = self.waiting_for_limits.get(tenant, 0)
                if waiting >= g.settings.submit_tenant_queue:
                    raise GatewayError(
                        429,
                        f"{exc.message} {waiting} submissions of "
                        f"tenant {tenant!r} already wait for its limits at this gateway; "
                        "this one was refused",
                        "rate_limit_exceeded",
                    ) from None
                left = deadline - time.time()
                if left <= exc.retry_after_s:
                    raise errors.deadline(deadline - submit.submitted_at) from None
                await self._wait_for_limits(tenant, exc.retry_after_s)
            prepared = await self._prepare(submit, tenant)

    async def _wait_for_limits(self, tenant: str, seconds: float) -> None:
        self.waiting_for_limits[tenant] += 1
        self._slots.release()  # a submission waiting for its tenant's limit leaves its place to others
        try:
            await asyncio.sleep(max(0.01, seconds))
        finally:
            self.waiting_for_limits[tenant] -= 1
            if not self.waiting_for_limits[tenant]:
                del self.waiting_for_limits[tenant]
            await self._slots.acquire()

    async def _stored(self, subject: str) -> bytes | None:
        stored = await last_message(self.gateway.js, subjects.RESULTS_STREAM, subject)
        return stored.data if stored is not None else None

    async def _dead_letter(self, msg, reason: str, *, tenant: str | None) -> None:
        """Park the message with its reason and, when its tenant and request id can be read, tell the
        sender on its own result subject."""
        g = self.gateway
        letter = dead_letter(SERVICE, msg.subject, reason, msg.data, msg.headers)
        await g.js.publish(subjects.dead_letter(SERVICE), letter.model_dump_json().encode())
        log.warning("dead-lettered a submission", extra={"reason": reason})
        rid = request_id_of(msg.data, max_len=100)
        if tenant and rid and await self._stored(subjects.tenant_results(tenant, rid)) is None:
            error = InferenceResult(
                request_id=rid, worker_id="gateway", ok=False, error=ErrorInfo(code="bad_request", message=reason)
            )
            await g.js.publish(
                subjects.tenant_results(tenant, rid),
                error.model_dump_json().encode(),
                headers={"Nats-Msg-Id": f"result-{tenant}-{rid}"},
            )
        g.metrics.submissions.add(1, {"outcome": "bad_request"})
        await msg.ack()
