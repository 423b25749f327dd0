"""The gate's value check with a scripted engine: the base model alone is scored without a system
prompt and, when the tenant has one, with it; both lifts are reported and the tenant's minimum lift
(else the gate's setting) holds against both."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from libs.contracts import EvalContextReply
from libs.contracts.reports import EvalReport
from libs.datasets import EvalCase
from services.eval_gate import criteria
from services.eval_gate.evaluation import Evaluator
from services.eval_gate.settings import EvalGateSettings

PIRATE = "Always answer like a pirate."
CASES = [
    EvalCase(split="eval", id=f"c{i}", criterion="contains", expected="Ahoy", messages=[{"role": "user", "content": q}])
    for i, q in enumerate(("Where is my order?", "Can I return it?", "Do you ship abroad?", "Hello"))
]


class ScriptedEngine:
    """The adapter always says Ahoy; the base model says it on the first two cases when prompted with
    the pirate system prompt, and never without it."""

    device = "cpu"
    seen: list[list[dict]]

    def __init__(self) -> None:
        self.seen = []

    async def generate(self, request):
        self.seen.append(request.messages)
        prompted = request.messages[0]["role"] == "system" and request.messages[0]["content"] == PIRATE
        question = request.messages[-1]["content"]
        ahoy = request.adapter is not None or (prompted and question in ("Where is my order?", "Can I return it?"))
        yield SimpleNamespace(text="Ahoy, matey!" if ahoy else "Your order ships soon.", token_ids=[1, 2])


def _report() -> EvalReport:
    score = criteria.score_version(1, "d" * 64, [criteria.judge_text(c, i, "Ahoy!") for i, c in enumerate(CASES)])
    return EvalReport(
        passed=False,
        reason="",
        tenant="acme",
        adapter="support",
        version=1,
        digest="d" * 64,
        base_model="smollm2-135m",
        threshold=0.8,
        regression_margin=0.0,
        candidate=score,
    )


def _evaluator(tmp_path: Path, **settings) -> tuple[Evaluator, ScriptedEngine]:
    engine = ScriptedEngine()
    gate = EvalGateSettings(work_dir=tmp_path, **settings)
    return Evaluator(gate, engine, store=None, base_path=tmp_path), engine


async def test_without_a_system_prompt_the_base_runs_once_and_the_lift_is_reported(tmp_path):
    evaluator, engine = _evaluator(tmp_path)
    report = _report()
    step = await evaluator._value(CASES, report, EvalContextReply(found=True))
    assert step.passed and "reported only" in step.detail
    assert report.lift.pass_rate == 1.0 and report.base.passed == 0
    assert report.base_prompted is None and report.lift_prompted is None and report.system_prompt is None
    assert len(engine.seen) == 4 and all(m[0]["role"] == "user" for m in engine.seen)


async def test_with_the_tenants_system_prompt_both_lifts_and_the_tenants_minimum(tmp_path):
    evaluator, engine = _evaluator(tmp_path, min_lift=0.9)  # the tenant's minimum wins over the gate's
    report = _report()
    context = EvalContextReply(found=True, system_prompt=PIRATE, min_lift=0.25)
    step = await evaluator._value(CASES, report, context)
    assert (report.lift.pass_rate, report.lift_prompted.pass_rate) == (1.0, 0.5)
    assert report.base_prompted.passed == 2 and report.system_prompt == PIRATE
    assert report.lift.min_lift == report.lift_prompted.min_lift == 0.25
    assert step.passed and "with the tenant's system prompt (2/4)" in step.detail
    assert sum(1 for m in engine.seen if m[0] == {"role": "system", "content": PIRATE}) == 4

    report = _report()
    step = await evaluator._value(CASES, report, EvalContextReply(found=True, system_prompt=PIRATE, min_lift=0.75))
    assert not step.passed and "prompting the base model does as well" in step.detail


async def test_the_gates_minimum_applies_when_the_tenant_sets_none(tmp_path):
    evaluator, _ = _evaluator(tmp_path, min_lift=0.75)
    step = await evaluator._value(CASES, _report(), EvalContextReply(found=True, system_prompt=PIRATE))
    assert not step.passed and "below the minimum lift +0.75" in step.detail
