"""How one eval case is judged, and how the pass rate, the regression margin and parity are decided.
Pure functions: the service feeds them engine outputs."""

from __future__ import annotations

import math
import re

from libs.contracts.reports import CaseResult, Lift, ParityCase, VersionScore
from libs.datasets import Criterion, EvalCase

ANSWER_CHARS = 400


def case_id(case: EvalCase, index: int) -> str:
    return case.id or f"case-{index + 1}"


def judge_text(case: EvalCase, index: int, answer: str) -> CaseResult:
    expected, got = case.expected or "", answer.strip()
    if case.ignore_case:
        expected, got = expected.lower(), got.lower()
    if case.criterion == Criterion.EXACT:
        passed = got == expected.strip()
    elif case.criterion == Criterion.CONTAINS:
        passed = expected in got
    elif case.criterion == Criterion.REGEX:
        passed = re.search(case.expected or "", answer, re.IGNORECASE if case.ignore_case else 0) is not None
    else:
        raise ValueError(f"{case.criterion} is not a text criterion")
    return CaseResult(
        id=case_id(case, index),
        criterion=str(case.criterion),
        passed=passed,
        answer=answer[:ANSWER_CHARS],
        expected=case.expected,
    )


def judge_loglik(case: EvalCase, index: int, token_logprobs: list[float]) -> CaseResult:
    score = sum(token_logprobs) / len(token_logprobs) if token_logprobs else -math.inf
    return CaseResult(
        id=case_id(case, index),
        criterion=str(case.criterion),
        passed=score >= case.threshold(),
        score=round(score, 4),
        threshold=case.threshold(),
    )


def score_version(version: int, digest: str, cases: list[CaseResult]) -> VersionScore:
    passed = sum(c.passed for c in cases)
    scores = [c.score for c in cases if c.score is not None]
    return VersionScore(
        version=version,
        digest=digest,
        passed=passed,
        total=len(cases),
        pass_rate=round(passed / len(cases), 4) if cases else 0.0,
        mean_loglik=round(sum(scores) / len(scores), 4) if scores else None,
        cases=cases,
    )


def threshold_verdict(score: VersionScore, threshold: float) -> tuple[bool, str]:
    failed = [
        f"{c.id} ({c.criterion}{' ' + repr(c.expected) if c.expected else ''})" for c in score.cases if not c.passed
    ]
    detail = f"pass rate {score.pass_rate:.2f} ({score.passed}/{score.total}), threshold {threshold:.2f}"
    if score.pass_rate + 1e-9 < threshold:
        return False, f"{detail}; failed: {', '.join(failed[:5])}{' ...' if len(failed) > 5 else ''}"
    return True, detail


def regression_verdict(
    candidate: VersionScore, baseline: VersionScore, margin: float, loglik_margin: float
) -> tuple[bool, str]:
    """Not worse than the active version by more than the margins."""
    drop = baseline.pass_rate - candidate.pass_rate
    detail = (
        f"pass rate {candidate.pass_rate:.2f} vs {baseline.pass_rate:.2f} for active v{baseline.version} "
        f"(margin {margin:.2f})"
    )
    if drop > margin + 1e-9:
        return False, detail
    if candidate.mean_loglik is not None and baseline.mean_loglik is not None:
        detail += f"; mean log-likelihood {candidate.mean_loglik:.3f} vs {baseline.mean_loglik:.3f}"
        if baseline.mean_loglik - candidate.mean_loglik > loglik_margin + 1e-9:
            return False, detail + f" (margin {loglik_margin:.2f})"
    return True, detail


def agreement(engine_ids: list[int], reference_ids: list[int]) -> float:
    """Leading tokens that match, over the longer output (1.0: identical)."""
    longest = max(len(engine_ids), len(reference_ids))
    if longest == 0:
        return 1.0
    same = 0
    for a, b in zip(engine_ids, reference_ids, strict=False):
        if a != b:
            break
        same += 1
    return same / longest


def parity_case(
    prompt: str,
    engine_text: str,
    reference_text: str,
    engine_ids: list[int],
    reference_ids: list[int],
    min_agreement: float,
) -> ParityCase:
    value = agreement(engine_ids, reference_ids)
    return ParityCase(
        prompt=prompt[:200],
        engine=engine_text[:ANSWER_CHARS],
        reference=reference_text[:ANSWER_CHARS],
        agreement=round(value, 4),
        passed=value >= 1.0 or value >= min_agreement,
    )


def parity_verdict(cases: list[ParityCase], min_agreement: float) -> tuple[bool, str]:
    if not cases:
        return True, "no parity prompts configured"
    bad = [c for c in cases if not c.passed]
    worst = min(c.agreement for c in cases)
    detail = (
        f"{len(cases) - len(bad)}/{len(cases)} prompts match transformers+peft "
        f"(lowest agreement {worst:.2f}, minimum {min_agreement:.2f})"
    )
    return not bad, detail


def lift_of(candidate: VersionScore, base: VersionScore, min_lift: float | None) -> Lift:
    loglik = None
    if candidate.mean_loglik is not None and base.mean_loglik is not None:
        loglik = round(candidate.mean_loglik - base.mean_loglik, 4)
    return Lift(pass_rate=round(candidate.pass_rate - base.pass_rate, 4), loglik=loglik, min_lift=min_lift)


def with_system_prompt(messages: list[dict], system_prompt: str | None) -> list[dict]:
    """The case's conversation with the tenant's system prompt first (before a system turn the case
    has itself, in the same turn); unchanged without one."""
    if not system_prompt:
        return messages
    if messages and messages[0].get("role") == "system":
        first = {**messages[0], "content": f"{system_prompt}\n\n{messages[0].get('content', '')}"}
        return [first, *messages[1:]]
    return [{"role": "system", "content": system_prompt}, *messages]


def _lift_detail(lift: Lift, base: VersionScore, how: str) -> str:
    detail = f"lift {lift.pass_rate:+.2f} in pass rate over the base model {how} ({base.passed}/{base.total})"
    if lift.loglik is not None:
        detail += f", {lift.loglik:+.3f} mean log-likelihood"
    return detail


def value_verdict(
    lift: Lift, base: VersionScore, prompted: tuple[Lift, VersionScore] | None = None
) -> tuple[bool, str]:
    """Whether the adapter adds enough over the base model alone (and, with `prompted`, over the base
    model with the tenant's system prompt: the minimum holds against both); without a minimum, report
    only."""
    detail = _lift_detail(lift, base, "alone")
    lifts = [lift.pass_rate]
    if prompted is not None:
        detail += "; " + _lift_detail(prompted[0], prompted[1], "with the tenant's system prompt")
        lifts.append(prompted[0].pass_rate)
    if lift.min_lift is None:
        return True, detail + " (reported only: no minimum lift set)"
    if min(lifts) + 1e-9 < lift.min_lift:
        return False, detail + f"; below the minimum lift {lift.min_lift:+.2f}: prompting the base model does as well"
    return True, detail + f" (minimum {lift.min_lift:+.2f})"
