"""The lifecycle's transition table: exactly the allowed moves, and the override edges."""

from __future__ import annotations

import itertools

import pytest

from services.registry.lifecycle import OVERRIDE_FROM, TRANSITIONS, TransitionRefused, check_transition
from services.registry.models import VersionStatus as S

ALLOWED = {(S.PENDING, S.EVALUATING), (S.EVALUATING, S.ACTIVE), (S.EVALUATING, S.REJECTED), (S.ACTIVE, S.RETIRED)}


@pytest.mark.parametrize(("current", "target"), list(itertools.product(S, S)))
def test_only_the_documented_transitions_are_allowed(current, target):
    if (current, target) in ALLOWED:
        check_transition(current, target)
    else:
        with pytest.raises(TransitionRefused, match=f"a {current} version cannot become {target}"):
            check_transition(current, target)


def test_activation_needs_an_evaluation_unless_overridden():
    with pytest.raises(TransitionRefused):
        check_transition(S.PENDING, S.ACTIVE)
    for current in (S.PENDING, S.EVALUATING, S.REJECTED):
        check_transition(current, S.ACTIVE, override=True)


@pytest.mark.parametrize("current", [S.ACTIVE, S.RETIRED])
def test_override_cannot_reactivate_active_or_retired(current):
    with pytest.raises(TransitionRefused, match="even with an admin override"):
        check_transition(current, S.ACTIVE, override=True)


def test_override_only_ever_leads_to_active():
    with pytest.raises(TransitionRefused):
        check_transition(S.REJECTED, S.RETIRED, override=True)


def test_terminal_states_and_table_covers_every_status():
    assert set(TRANSITIONS) == set(S)
    assert TRANSITIONS[S.REJECTED] == TRANSITIONS[S.RETIRED] == frozenset()
    assert OVERRIDE_FROM == {S.PENDING, S.EVALUATING, S.REJECTED}


def test_status_read_back_as_plain_text_still_checks():
    check_transition("pending", "evaluating")  # rows hold the value as text
    with pytest.raises(TransitionRefused):
        check_transition("rejected", "active")
