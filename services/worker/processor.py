"""One inference request, from a JetStream message to a published result.

Order of things (each a guarantee): parse or dead-letter; skip what was already answered (request
ids make redelivery idempotent); fail closed on anything wrong with the adapter; generate; publish
tokens and the final result (results.py); only then ack. A request that names an adapter is never
generated without it.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from nats.aio.msg import Msg
from opentelemetry import trace
from pydantic import ValidationError

from libs.bus.consumer import kept_in_progress
from libs.bus.dead_letters import dead_letter
from libs.bus.recent_ids import RecentIds
from libs.bus.retry import last_message
from libs.contracts import (
    AdapterTier,
    ErrorInfo,
    InferenceRequest,
    InferenceResult,
    Timings,
    TokenDelta,
    TokenLogprob,
    TopLogprob,
    subjects,
)
from libs.contracts.parsing import first_error, reply_to_of, request_id_of
from libs.engine import GenerationRequest, RequestRejected, TokenLogprobs
from libs.telemetry import extract_context, inject_headers
from services.worker.admission import AdapterAdmission
from services.worker.batch_share import BatchShare, HandedBack
from services.worker.engine_admission import EngineAdmission, Ticket
from services.worker.freshness import skips_duplicate_lookup
from services.worker.metrics import WorkerMetrics
from services.worker.results import ResultPublisher, publish_deadline
from services.worker.tiers import AdapterLease, AdapterTiers, AdapterUnavailable
from services.worker.token_batches import TokenBatches

log = logging.getLogger(__name__)
tracer = trace.get_tracer("loraplex.worker")


@dataclass
class _Outcome:
    text: str = ""
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ttft_s: float = 0.0
    engine_added_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    logprobs: list[TokenLogprob] | None = None


class RequestProcessor:
    def __init__(
        self,
        *,
        worker_id: str,
        nc,
        js,
        engine,
        tiers: AdapterTiers,
        metrics: WorkerMetrics,
        ack_wait_s: float,
        admission: AdapterAdmission | EngineAdmission | None = None,
        batch_share: BatchShare | None = None,
        token_batches: bool = True,
    ) -> None:
        self.worker_id = worker_id
        self.admission = admission  # None: every request goes to the engine at once, unguarded
        self.batch_share = batch_share  # None: no per-tenant share of the batch
        self.nc, self.js = nc, js
        self.engine = engine
        self.tiers = tiers
        self.metrics = metrics
        self.ack_wait_s = ack_wait_s
        self.active: set[str] = set()
        self.answered = RecentIds()
        self.generated_tokens = 0
        self.results = ResultPublisher(worker_id, nc, js)
        self.tokens = TokenBatches(nc, worker_id, enabled=token_batches)

    async def handle(
        self,
        msg: Msg,
        on_result: Callable[[], Awaitable[None]] | None = None,
        taken_at: float | None = None,
        on_leaving: Callable[[], Awaitable[float | None]] | None = None,
    ) -> None:
        """One message, start to acknowledgement. `on_leaving`: awaited before the result is stamped, to
        tell the pool the request is leaving (returns that report's time); `on_result`: awaited once it is
        stamped and about to be published (the worker stops counting it in its own load then). `taken_at`:
        when the worker kept it (its load bound checked then), else now: the request's `fetched_at`."""
        fetched_at = taken_at or time.time()
        try:
            request = InferenceRequest.model_validate_json(msg.data)
        except ValidationError as exc:
            await self._dead_letter(msg, f"invalid InferenceRequest: {first_error(exc)}")
            return
        rid = request.request_id
        if rid in self.active:
            await msg.in_progress()  # a redelivery while we generate: the original will ack
            return
        if rid in self.answered or (
            not skips_duplicate_lookup(msg, request, fetched_at) and await self._already_answered(request)
        ):
            self.answered.add(rid)
            await msg.ack()
            return
        self.active.add(rid)
        try:
            try:
                with tracer.start_as_current_span(
                    "worker.infer",
                    context=extract_context(msg.headers),
                    attributes={"lpx.request_id": rid, "lpx.worker": self.worker_id, "lpx.tenant": request.tenant_id},
                ):
                    result = await self._process(request, msg, fetched_at)
            except HandedBack:
                await msg.nak()  # unstarted: redelivered (the draining worker hands its own queue to the pool)
                return
            result = result.model_copy(update=_caller_of(request))
            await self.results.publish(
                result,
                request.reply_to,
                give_up_at=publish_deadline(request),
                on_stamped=on_result,
                on_leaving=on_leaving,
            )
            await msg.ack()
            self.answered.add(rid)
            self.metrics.requests.add(1, {"outcome": "ok" if result.ok else result.error.code})
        finally:
            self.active.discard(rid)

    async def _process(self, request: InferenceRequest, msg: Msg, fetched_at: float) -> InferenceResult:
        started = time.monotonic()
        timings = {"queue_s": max(0.0, fetched_at - request.submitted_at), "fetched_at": fetched_at}
        if request.deadline is not None and time.time() > request.deadline:
            return self._error(request, "deadline", "the request's deadline passed before it was started", timings)
        lease: AdapterLease | None = None
        if request.adapter is not None:
            try:
                lease = await self.tiers.acquire(request.adapter)
            except AdapterUnavailable as exc:
                log.warning(
                    "adapter unavailable",
                    extra={"request_id": request.request_id, "code": exc.code, "reason": str(exc)},
                )
                return self._error(request, exc.code, str(exc), timings)
            self.metrics.record_tier(lease.tier, lease.load_s)
            timings["adapter_load_s"] = lease.load_s
        try:
            # Long generations must not be redelivered to someone else: JetStream hears we are on it,
            # through slot waits and generation alike.
            async with (
                kept_in_progress(msg, self.ack_wait_s),
                self._shared(request.tenant_id) as shared_wait,
                self._admitted(lease) as ticket,
            ):
                timings["admission_wait_s"] = (shared_wait or 0.0) + ticket.waited  # batch share, then slot
                outcome = await self._generate(request, lease, ticket.started)
        except HandedBack:
            raise  # draining before it started: handle() gives the message back
        except RequestRejected as exc:  # the request asked for something the engine cannot do
            log.info("engine refused a request", extra={"request_id": request.request_id, "reason": str(exc)})
            return self._error(request, "bad_request", str(exc), timings)
        except Exception as exc:
            log.exception("generation failed", extra={"request_id": request.request_id})
            return self._error(request, "engine_error", f"{type(exc).__name__}: {exc}", timings)
        finally:
            if lease is not None:
                self.tiers.release(lease)
        self.generated_tokens += outcome.completion_tokens
        self.metrics.tokens.add(outcome.completion_tokens)
        self.metrics.ttft_seconds.record(outcome.ttft_s)
        timeline = dict(
            engine_added_at=outcome.engine_added_at,
            first_token_at=outcome.first_token_at,
            last_token_at=outcome.last_token_at,
        )
        return InferenceResult(
            request_id=request.request_id,
            worker_id=self.worker_id,
            ok=True,
            text=outcome.text,
            finish_reason=outcome.finish_reason,
            prompt_tokens=outcome.prompt_tokens,
            completion_tokens=outcome.completion_tokens,
            adapter_digest_applied=lease.spec.digest if lease else None,
            adapter_tier=lease.tier if lease else AdapterTier.NONE,
            logprobs=outcome.logprobs,
            timings=Timings(**timings, **timeline, ttft_s=outcome.ttft_s, total_s=time.monotonic() - started),
        )

    def _shared(self, tenant: str):
        """A place in the batch by the tenant's share (at once without a batch share)."""
        return self.batch_share.slot(tenant) if self.batch_share is not None else contextlib.nullcontext()

    @contextlib.asynccontextmanager
    async def _admitted(self, lease: AdapterLease | None):
        """A place in the engine: at once for the base model or without admission control."""
        if self.admission is None:
            yield Ticket(0.0)
            return
        async with self.admission.admitted(lease.spec.digest if lease else None) as place:
            ticket = place if isinstance(place, Ticket) else Ticket(place)  # grouped admission yields the wait
            if lease is not None:
                self.metrics.admission_wait_seconds.record(ticket.waited)
            yield ticket

    async def _generate(
        self, request: InferenceRequest, lease: AdapterLease | None, on_started=lambda: None
    ) -> _Outcome:
        s = request.sampling
        gen = GenerationRequest(
            request_id=request.request_id,
            prompt=request.prompt,
            messages=[m.model_dump() for m in request.messages] if request.messages else None,
            max_tokens=s.max_tokens,
            temperature=s.temperature,
            top_p=s.top_p,
            stop=list(s.stop),
            seed=s.seed,
            adapter=lease.spec if lease else None,
            trace_headers=inject_headers(),
            logprobs=s.logprobs,
            structured=_engine_structured(s.structured),
        )
        if request.adapter is not None and gen.adapter is None:  # belt and braces: never fall back to base
            raise RuntimeError("adapter requested but not applied")
        out, started, index = _Outcome(engine_added_at=time.time()), time.monotonic(), 0
        if s.logprobs is not None:
            out.logprobs = []
        async for chunk in self.engine.generate(gen):
            on_started()  # the engine scheduled it (idempotent): the admission guard stops counting its wait
            if chunk.text and not out.ttft_s:
                out.ttft_s = time.monotonic() - started
                out.first_token_at = time.time()
            logprobs = _contract_logprobs(chunk.logprobs, s.logprobs)
            if logprobs is not None and out.logprobs is not None:
                out.logprobs.extend(logprobs)
            if request.stream and (chunk.text or logprobs):
                delta = TokenDelta(request_id=request.request_id, index=index, text=chunk.text, logprobs=logprobs)
                await self.tokens.send(delta, request.reply_to)
                index += 1
            out.text += chunk.text
            out.completion_tokens, out.prompt_tokens = chunk.completion_tokens, chunk.prompt_tokens
            out.finish_reason = chunk.finish_reason or out.finish_reason
        out.last_token_at = time.time()
        if request.stream:
            await self.tokens.drain()  # the gateway gets the last tokens before the result
        return out

    def _error(self, request: InferenceRequest, code: str, message: str, timings: dict) -> InferenceResult:
        return InferenceResult(
            request_id=request.request_id,
            worker_id=self.worker_id,
            ok=False,
            error=ErrorInfo(code=code, message=message),
            timings=Timings(**timings),
        )

    async def _already_answered(self, request: InferenceRequest) -> bool:
        subject = subjects.result_lookup(request.request_id, request.reply_to)
        return await last_message(self.js, subjects.RESULTS_STREAM, subject) is not None

    async def _dead_letter(self, msg: Msg, reason: str) -> None:
        letter = dead_letter("worker", msg.subject, reason, msg.data, msg.headers)
        await self.js.publish(subjects.dead_letter("worker"), letter.model_dump_json().encode())
        log.warning("dead-lettered a message", extra={"subject": msg.subject, "reason": reason})
        rid = request_id_of(msg.data)
        if rid:  # the caller is waiting: answer with the reason instead of leaving it to time out
            error = InferenceResult(
                request_id=rid, worker_id=self.worker_id, ok=False, error=ErrorInfo(code="bad_request", message=reason)
            )
            await self.results.publish(error, reply_to_of(msg.data))
        await msg.ack()  # the dead-letter stream holds it now; nothing is lost


def _engine_structured(structured) -> dict | None:
    """The contract's structured output as vLLM's StructuredOutputsParams fields."""
    if structured is None:
        return None
    if structured.kind == "json_object":
        return {"json_object": True}
    return {"json": structured.json_schema}


def _contract_logprobs(logprobs: list[TokenLogprobs] | None, alternatives: int | None) -> list[TokenLogprob] | None:
    """The engine's token logprobs on the wire, keeping the alternatives any caller can ask for: OpenAI's
    completions API shows `logprobs` + 1 of them (chat shows `top_logprobs`)."""
    if logprobs is None or alternatives is None:
        return None
    keep = alternatives + 1
    return [
        TokenLogprob(token=t.token, logprob=t.logprob, top=[TopLogprob(token=a, logprob=lp) for a, lp in t.top[:keep]])
        for t in logprobs
    ]


def _caller_of(request: InferenceRequest) -> dict:
    """What a result says about who asked (usage metering in the registry counts from it)."""
    digest = request.adapter.digest if request.adapter else None
    return {"tenant": request.tenant_id, "adapter_digest": digest, "base_model": request.base_model}
