"""A responder skips a request whose asker no longer waits, and cuts off read-only work at the deadline."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from faststream.exceptions import SkipMessage

from libs.contracts.deadline import CLOCK_SKEW_S, DEADLINE_HEADER, deadline_headers, seconds_left
from services.registry.deadlines import Expired, answer_in_time


def test_seconds_left_reads_the_header_with_the_skew_allowance():
    headers = deadline_headers(5.0, now=1000.0)
    assert headers == {DEADLINE_HEADER: "1005.000"}
    assert seconds_left(headers, now=1004.0) == pytest.approx(1.0 + CLOCK_SKEW_S)
    assert seconds_left(headers, now=1007.0) == pytest.approx(-2.0 + CLOCK_SKEW_S)


@pytest.mark.parametrize("headers", [None, {}, {DEADLINE_HEADER: "soon"}, {DEADLINE_HEADER: "nan"}, {"other": "1"}])
def test_a_request_without_a_readable_deadline_has_none(headers):
    assert seconds_left(headers) is None


async def test_a_request_past_its_deadline_is_skipped_without_doing_the_work():
    expired, started = Expired(), []

    async def work():
        started.append(1)
        return "answer"

    with pytest.raises(SkipMessage):
        await answer_in_time(expired, "lpx.registry.resolve", deadline_headers(-5.0), work())
    assert started == [] and expired.skipped == {"lpx.registry.resolve": 1}


async def test_a_request_in_time_or_without_a_deadline_is_answered():
    async def work():
        return "answer"

    expired = Expired()
    assert await answer_in_time(expired, "s", deadline_headers(5.0), work()) == "answer"
    assert await answer_in_time(expired, "s", None, work()) == "answer"
    assert expired.skipped == {}


async def test_read_only_work_is_cut_off_at_the_deadline_and_other_work_is_not():
    async def slow():
        await asyncio.sleep(CLOCK_SKEW_S + 0.3)
        return "late"

    expired = Expired()
    with pytest.raises(SkipMessage):
        await answer_in_time(expired, "s", deadline_headers(0.0), slow())
    assert expired.skipped == {"s": 1}
    assert await answer_in_time(expired, "s", deadline_headers(0.0), slow(), cut_off=False) == "late"


async def test_the_works_own_timeout_is_not_taken_for_the_deadline():
    async def fails():
        raise TimeoutError("database connect")

    with pytest.raises(TimeoutError, match="database connect"):
        await answer_in_time(Expired(), "s", deadline_headers(5.0), fails())


class _Client:
    """The two things of a nats-py client the check reads."""

    def __init__(self) -> None:
        self.is_connected = True
        self.stats = {"reconnects": 0}


async def test_no_reply_when_the_connection_the_request_came_on_was_lost_meanwhile():
    """The server grants the reply right to the connection that got the request; nats-py would send a
    reply written during a reconnect on the new one, to be refused (a Publish Violation)."""
    link = SimpleNamespace(nc=_Client())

    async def work_across(event):
        event(link.nc)
        return "answer"

    def reconnected(nc):
        nc.stats["reconnects"] += 1

    def reconnecting(nc):
        nc.is_connected = False

    expired = Expired()
    for event in (reconnected, reconnecting):
        with pytest.raises(SkipMessage):
            await answer_in_time(expired, "s", deadline_headers(5.0), work_across(event), link=link)
    assert expired.skipped == {"s": 2}
    link.nc.is_connected = True
    assert await answer_in_time(expired, "s", None, work_across(lambda nc: None), link=link) == "answer"
