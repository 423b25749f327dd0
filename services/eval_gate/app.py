"""The eval gate service: consumes the registry's `registered` and `eval_requested` events for its
base model through a durable pull consumer, evaluates one version at a time and publishes an
EvaluationResult (Nats-Msg-Id = a digest of the source event id) that the registry turns into
activation or rejection.

Exactly once: the event is acknowledged only after the verdict is published and written to the
ledger; a crash before that redelivers the event (after ack_wait) and the evaluation runs again from
the start; a crash after publishing re-publishes the recorded verdict, which JetStream and the
registry both de-duplicate. A redelivered event never produces a second, different verdict.

Hand-written over nats-py (not a FastStream subscriber) because one long evaluation needs explicit
control of the keep-alive (in_progress) and of when the message is acknowledged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from nats.js.api import DeliverPolicy
from pydantic import ValidationError

from libs.bus.consumer import PullConsumer, durable_pull, kept_in_progress, one_at_a_time
from libs.bus.dead_letters import DeadLetterPublisher, JetStreamPublisher
from libs.bus.link import BrokerLink
from libs.bus.retry import publish_retrying
from libs.contracts import (
    AdapterEvent,
    AdapterEventKind,
    EvalContextReply,
    EvalContextRequest,
    EvaluationResult,
    subjects,
)
from libs.contracts.deadline import deadline_headers
from libs.contracts.parsing import first_error
from libs.contracts.reports import CheckResult, EvalReport
from libs.engine import EngineConfig, create_engine
from libs.objectstore import ObjectStore
from libs.telemetry import Telemetry, setup_telemetry
from services.eval_gate.evaluation import Candidate, Evaluator
from services.eval_gate.ledger import Ledger, ledger_config, result_event_id
from services.eval_gate.metrics import GateMetrics, register_queue_gauge
from services.eval_gate.settings import EvalGateSettings

log = logging.getLogger(__name__)
SERVICE = "eval-gate"
EVALUATE_KINDS = frozenset({AdapterEventKind.REGISTERED, AdapterEventKind.EVAL_REQUESTED})
AWAITING = frozenset({"pending", "evaluating"})
RETRY_DELAY_S = 5.0
VERDICT_RETRY_S = 300.0


class EvalGate:
    def __init__(self, settings: EvalGateSettings, *, engine=None, telemetry: Telemetry | None = None) -> None:
        self.settings = settings
        self.telemetry = telemetry or setup_telemetry(
            SERVICE, metrics_port=settings.metrics_port, metrics_host=settings.metrics_host, set_global=False
        )
        self.metrics = GateMetrics.create(self.telemetry.meter())
        self._own_engine = engine is None
        self.engine = engine or create_engine(self._engine_config())
        self.store = ObjectStore(settings.connections)
        self.evaluator = Evaluator(settings, self.engine, self.store, settings.resolved_model_path())
        self.queued = 0
        self.evaluated = 0  # verdicts published by this process (tests and logs)
        self._stopping = asyncio.Event()
        self._loops: list[asyncio.Task] = []
        register_queue_gauge(self.telemetry.meter(), self)

    def _engine_config(self) -> EngineConfig:
        s = self.settings
        return EngineConfig(
            model_path=s.resolved_model_path(),
            served_model_name=s.base_model,
            device=s.device,
            max_loras=s.max_loras,
            max_cpu_loras=s.max_cpu_loras,
            max_lora_rank=s.max_lora_rank,
            max_model_len=s.max_model_len,
            cpu_kvcache_gib=s.cpu_kvcache_gib,
        )

    # --- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        s = self.settings
        await self.engine.start()
        self.link = BrokerLink(s.connections, f"eval-gate-{s.gate_id}", buckets=[ledger_config()], role="eval-gate")
        self.nc = await self.link.connect()
        self.js = self.link.js
        self.dead_letters = DeadLetterPublisher(JetStreamPublisher(self.js), SERVICE)
        self.ledger = await Ledger.open(self.js)
        self.sub = await self._consumer()
        self._loops = [
            asyncio.create_task(self._events().run(self._stopping), name="eval-pull"),
            asyncio.create_task(self._watch_queue(), name="eval-queue"),
        ]
        log.info(
            "eval gate ready", extra={"gate": s.gate_id, "base_model": s.base_model, "durable": s.resolved_durable()}
        )

    async def _consumer(self):
        s = self.settings
        policy = DeliverPolicy.NEW if s.deliver_policy == "new" else DeliverPolicy.ALL
        # One event at a time per gate (max_ack_pending=1 per replica would serialise the whole
        # group, so the limit is the replicas' business: each fetches one and works on it).
        return await durable_pull(
            self.link,
            subjects.EVENTS_STREAM,
            subjects.ADAPTER_EVENTS,
            s.resolved_durable(),
            ack_wait=s.ack_wait_s,
            deliver_policy=policy,
        )

    def _events(self) -> PullConsumer:
        room, deliver = one_at_a_time(self.handle, RETRY_DELAY_S)
        return PullConsumer(self.sub, "adapter events", room=room, deliver=deliver)

    async def run_until(self, stop: asyncio.Event) -> None:
        await stop.wait()
        await self.stop()

    async def stop(self) -> None:
        """Stop pulling; an evaluation in progress is abandoned unacknowledged (it is redelivered)."""
        self._stopping.set()
        for loop in self._loops:
            loop.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)
        with contextlib.suppress(Exception):
            await self.sub.unsubscribe()
        await self.link.close()

    async def close(self) -> None:
        if self._own_engine:
            await self.engine.shutdown()
        self.telemetry.shutdown()

    # --- consuming -------------------------------------------------------------------------------
    async def _watch_queue(self) -> None:
        while True:
            with contextlib.suppress(Exception):
                info = await self.sub.consumer_info()
                self.queued = info.num_pending + max(0, info.num_ack_pending - 1)
            await asyncio.sleep(5.0)

    async def handle(self, msg) -> None:
        try:
            event = AdapterEvent.model_validate_json(msg.data)
        except ValidationError as exc:
            await self.dead_letters.send(
                msg.subject, f"malformed AdapterEvent: {first_error(exc)}", msg.data, msg.headers
            )
            await msg.ack()
            return
        skip = self._not_for_us(event)
        if skip:
            self.metrics.skipped.add(1, {"reason": skip})
            await msg.ack()
            return
        if event.version is None or event.ref is None:
            await self.dead_letters.send(
                msg.subject, f"{event.kind} event without version or ref", msg.data, msg.headers
            )
            await msg.ack()
            return
        recorded = await self.ledger.get(event.event_id)
        if recorded is not None:
            log.info("event %s was already evaluated; re-publishing its verdict", event.event_id)
            await self._publish(recorded)
            self.metrics.skipped.add(1, {"reason": "duplicate"})
            await msg.ack()
            return
        await self._evaluate_event(msg, event)

    def _not_for_us(self, event: AdapterEvent) -> str | None:
        if event.kind not in EVALUATE_KINDS:
            return "other_kind"
        if event.base_model != self.settings.base_model:
            return "other_base"  # that base's gates have their own durable consumer
        return None

    async def _evaluate_event(self, msg, event: AdapterEvent) -> None:
        context = await self._context(event)
        if context is None:
            await msg.nak(delay=RETRY_DELAY_S)  # registry unreachable: no verdict, try again later
            return
        if not context.found:
            await self.dead_letters.send(
                msg.subject, f"the registry does not know this version: {context.error}", msg.data, msg.headers
            )
            await msg.ack()
            return
        if context.status not in AWAITING:
            log.info(
                "%s/%s v%s is already %s; not evaluated", event.tenant, event.adapter, event.version, context.status
            )
            self.metrics.skipped.add(1, {"reason": "decided"})
            await msg.ack()
            return
        attempt = getattr(getattr(msg, "metadata", None), "num_delivered", 1) or 1
        candidate = Candidate(event.tenant, event.adapter, event.version, event.ref, event.event_id, attempt)
        report = await self._evaluate_with_keepalive(msg, candidate, context)
        result = EvaluationResult(
            event_id=result_event_id(event.event_id),
            digest=event.ref.digest,
            passed=report.passed,
            reason=report.reason,
            report=report.model_dump(mode="json"),
            tenant=event.tenant,
            adapter=event.adapter,
            version=event.version,
        )
        await self._publish(result)
        await self.ledger.put(event.event_id, result)
        await msg.ack()
        self.evaluated += 1

    async def _context(self, event: AdapterEvent) -> EvalContextReply | None:
        request = EvalContextRequest(tenant=event.tenant, adapter=event.adapter, version=event.version, claim=True)
        try:
            timeout = self.settings.registry_timeout_s
            reply = await self.nc.request(
                subjects.EVAL_CONTEXT,
                request.model_dump_json().encode(),
                timeout=timeout,
                headers=deadline_headers(timeout),
            )
            context = EvalContextReply.model_validate_json(reply.data)
        except Exception as exc:
            log.warning("registry unreachable for eval context (%s); will retry", type(exc).__name__)
            return None
        if not context.found and context.code == "unavailable":
            return None
        return context

    async def _evaluate_with_keepalive(self, msg, candidate: Candidate, context: EvalContextReply) -> EvalReport:
        label = f"{candidate.tenant}/{candidate.adapter} v{candidate.version}"
        log.info("evaluating %s (sha256 %s, attempt %d)", label, candidate.ref.digest[:12], candidate.attempt)
        self.metrics.running.add(1)
        started = time.monotonic()
        try:
            async with kept_in_progress(msg, self.settings.ack_wait_s):
                report = await asyncio.wait_for(
                    self.evaluator.evaluate(candidate, context), self.settings.eval_timeout_s
                )
        except TimeoutError:
            report = self._timed_out(candidate, context)
        finally:
            self.metrics.running.add(-1)
        seconds = time.monotonic() - started
        outcome = "passed" if report.passed else "failed"
        self.metrics.evaluations.add(1, {"outcome": outcome})
        self.metrics.duration.record(seconds, {"outcome": outcome})
        failed = [c.name for c in report.checks if c.status == "failed"]
        if failed:
            self.metrics.check_failures.add(1, {"check": failed[0]})
        log.info("%s %s in %.1fs: %s", label, outcome.upper(), seconds, report.reason)
        return report

    def _timed_out(self, candidate: Candidate, context: EvalContextReply) -> EvalReport:
        reason = f"timeout: the evaluation took longer than {self.settings.eval_timeout_s:.0f}s"
        return EvalReport(
            passed=False,
            reason=reason,
            tenant=candidate.tenant,
            adapter=candidate.adapter,
            version=candidate.version,
            digest=candidate.ref.digest,
            base_model=candidate.ref.base_model,
            dataset=context.dataset,
            threshold=context.threshold or self.settings.default_threshold,
            regression_margin=self.settings.regression_margin,
            checks=[CheckResult(name="eval", status="failed", detail=reason)],
            gate={
                "gate_id": self.settings.gate_id,
                "attempt": candidate.attempt,
                "source_event_id": candidate.source_event_id,
            },
        )

    async def _publish(self, result: EvaluationResult) -> None:
        # Retried while the broker is away (same Nats-Msg-Id): a finished evaluation is not thrown away.
        await publish_retrying(
            self.js,
            subjects.EVALUATED,
            result.model_dump_json().encode(),
            stream=subjects.EVENTS_STREAM,
            headers={"Nats-Msg-Id": result.event_id},
            give_up_at=time.time() + VERDICT_RETRY_S,
            attempt_timeout_s=10,
        )
