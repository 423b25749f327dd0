"""The gate's judgements: each criterion, the pass-rate threshold, the regression margins, parity."""

from __future__ import annotations

import pytest

from libs.datasets import EvalCase
from services.eval_gate import criteria

USER = [{"role": "user", "content": "hi"}]


def case(criterion: str, expected: str | None = None, **kw) -> EvalCase:
    messages = USER + [{"role": "assistant", "content": "ref"}] if criterion == "loglik" else USER
    return EvalCase(split="eval", criterion=criterion, expected=expected, messages=messages, **kw)


@pytest.mark.parametrize(
    ("criterion", "expected", "answer", "passed", "kw"),
    [
        ("exact", "Ahoy!", "  Ahoy!\n", True, {}),
        ("exact", "Ahoy!", "Ahoy! matey", False, {}),
        ("contains", "Ahoy", "Well, Ahoy matey", True, {}),
        ("contains", "ahoy", "Well, Ahoy matey", False, {}),
        ("contains", "ahoy", "Well, Ahoy matey", True, {"ignore_case": True}),
        ("regex", r"\bArr\b", "Arr, me hearty", True, {}),
        ("regex", r"^Dear", "Hello. Dear", False, {}),
    ],
)
def test_text_criteria(criterion, expected, answer, passed, kw):
    assert criteria.judge_text(case(criterion, expected, **kw), 0, answer).passed is passed


def test_loglik_uses_the_mean_token_log_likelihood():
    result = criteria.judge_loglik(case("loglik", min_score=-1.0), 2, [-0.5, -1.0, -1.2])
    assert result.id == "case-3" and result.score == pytest.approx(-0.9) and result.passed
    assert not criteria.judge_loglik(case("loglik"), 0, [-3.0, -2.0]).passed  # default threshold -1.0
    assert not criteria.judge_loglik(case("loglik"), 0, []).passed


def _score(version: int, outcomes: list[bool], logliks: list[float] | None = None):
    from libs.contracts.reports import CaseResult

    cases = [CaseResult(id=f"c{i}", criterion="contains", passed=p, expected="x") for i, p in enumerate(outcomes)]
    cases += [CaseResult(id=f"l{i}", criterion="loglik", passed=True, score=s) for i, s in enumerate(logliks or [])]
    return criteria.score_version(version, "0" * 64, cases)


def test_threshold_and_regression_verdicts():
    good, weak = _score(1, [True] * 4, [-0.2]), _score(2, [True, True, True, False], [-0.3])
    assert good.pass_rate == 1.0 and good.mean_loglik == -0.2
    assert criteria.threshold_verdict(weak, 0.8)[0]
    ok, detail = criteria.threshold_verdict(_score(3, [True, False, False, False, False]), 0.8)
    assert not ok and "pass rate 0.20 (1/5)" in detail and "c1 (contains 'x')" in detail
    assert criteria.regression_verdict(weak, good, margin=0.25, loglik_margin=0.5)[0]
    ok, detail = criteria.regression_verdict(weak, good, margin=0.1, loglik_margin=0.5)
    assert not ok and detail.startswith("pass rate 0.80 vs 1.00 for active v1")
    worse_loglik = _score(4, [True] * 5, [-2.0])
    ok, detail = criteria.regression_verdict(worse_loglik, good, margin=0.1, loglik_margin=0.5)
    assert not ok and "mean log-likelihood -2.000 vs -0.200" in detail


def test_parity_agreement():
    assert criteria.agreement([1, 2, 3], [1, 2, 3]) == 1.0
    assert criteria.agreement([1, 2, 3, 4], [1, 2, 9, 9]) == 0.5
    assert criteria.agreement([], []) == 1.0
    same = criteria.parity_case("p", "a", "a", [1, 2], [1, 2], 0.75)
    late = criteria.parity_case("p", "a", "b", [1, 2, 3, 4], [1, 2, 3, 5], 0.75)
    early = criteria.parity_case("p", "a", "b", [1, 2, 3, 4], [9, 2, 3, 4], 0.75)
    assert same.passed and late.passed and not early.passed
    ok, detail = criteria.parity_verdict([same, late, early], 0.75)
    assert not ok and detail.startswith("2/3 prompts match")


def _version_score(version: int, passed: int, total: int, loglik: float | None = None):
    from libs.contracts.reports import VersionScore

    return VersionScore(version=version, digest="d", passed=passed, total=total, pass_rate=passed / total,
                        mean_loglik=loglik)  # fmt: skip


def test_the_lift_is_reported_and_never_rejects_without_a_minimum():
    adapter, base = _version_score(1, 3, 3, loglik=-1.2), _version_score(0, 3, 3, loglik=-2.0)
    lift = criteria.lift_of(adapter, base, None)
    assert lift.pass_rate == 0.0 and lift.loglik == pytest.approx(0.8)
    passed, detail = criteria.value_verdict(lift, base)
    assert passed and "lift +0.00" in detail and "reported only" in detail


def test_an_adapter_below_the_minimum_lift_is_refused_with_the_reason():
    adapter, base = _version_score(1, 2, 4), _version_score(0, 2, 4)
    passed, detail = criteria.value_verdict(criteria.lift_of(adapter, base, 0.25), base)
    assert not passed and "below the minimum lift +0.25" in detail and "prompting the base model does as well" in detail
    passed, _ = criteria.value_verdict(criteria.lift_of(_version_score(1, 4, 4), base, 0.25), base)
    assert passed  # +0.50


def test_the_tenants_system_prompt_goes_first_in_every_case():
    user = [{"role": "user", "content": "hi"}]
    assert criteria.with_system_prompt(user, None) == user and criteria.with_system_prompt(user, "") == user
    assert criteria.with_system_prompt(user, "Be a pirate.") == [{"role": "system", "content": "Be a pirate."}, *user]
    own = [{"role": "system", "content": "Answer briefly."}, *user]
    assert criteria.with_system_prompt(own, "Be a pirate.") == [
        {"role": "system", "content": "Be a pirate.\n\nAnswer briefly."},
        *user,
    ]
    assert own[0]["content"] == "Answer briefly."  # the case itself is not changed


def test_both_lifts_are_reported_and_the_minimum_holds_against_the_prompted_base_too():
    adapter, alone, prompted = _version_score(1, 4, 4), _version_score(0, 1, 4), _version_score(0, 3, 4)
    lift, lift_prompted = criteria.lift_of(adapter, alone, None), criteria.lift_of(adapter, prompted, None)
    passed, detail = criteria.value_verdict(lift, alone, (lift_prompted, prompted))
    assert passed and "reported only" in detail
    assert "lift +0.75 in pass rate over the base model alone (1/4)" in detail
    assert "lift +0.25 in pass rate over the base model with the tenant's system prompt (3/4)" in detail
    # a tenant minimum of 0.5: enough over the bare base model, not over the prompted one
    lift, lift_prompted = criteria.lift_of(adapter, alone, 0.5), criteria.lift_of(adapter, prompted, 0.5)
    passed, detail = criteria.value_verdict(lift, alone, (lift_prompted, prompted))
    assert not passed and "below the minimum lift +0.50" in detail
    assert criteria.value_verdict(lift, alone)[0]  # without the system prompt it would pass


def test_every_check_in_the_order_can_be_recorded():
    """The report's check names and the order the gate runs them in are one list (a check missing from
    the names failed every evaluation at its end)."""
    from typing import get_args

    from libs.contracts.reports import CHECK_ORDER, CheckName, CheckResult

    assert set(get_args(CheckName)) == set(CHECK_ORDER)
    assert [CheckResult(name=n, status="skipped").name for n in CHECK_ORDER] == list(CHECK_ORDER)
