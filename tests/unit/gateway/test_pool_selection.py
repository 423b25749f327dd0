"""Pool choice from heartbeats: base model, smallest sufficient max rank, liveness."""

from __future__ import annotations

import pytest

from libs.contracts import WorkerHeartbeat
from services.gateway.pool_view import NoPoolError, live_workers, select_pool


def beat(worker: str, pool: str, base: str = "llama", rank: int = 16, ts: float = 1000.0) -> WorkerHeartbeat:
    return WorkerHeartbeat(worker_id=worker, pool=pool, base_model=base, max_rank=rank, capacity=8, in_flight=0, ts=ts)


def view(*beats: WorkerHeartbeat) -> dict[str, WorkerHeartbeat]:
    return {b.worker_id: b for b in beats}


def test_smallest_rank_that_fits():
    live = view(beat("a", "r16", rank=16), beat("b", "r64", rank=64), beat("c", "r64", rank=64))
    assert select_pool(live, "llama", 8).pool == "r16"
    assert select_pool(live, "llama", 16).pool == "r16"
    choice = select_pool(live, "llama", 32)
    assert choice.pool == "r64" and choice.workers == ("b", "c") and choice.max_rank == 64
    with pytest.raises(NoPoolError):
        select_pool(live, "llama", 128)


def test_base_model_must_match():
    live = view(beat("a", "old", base="llama"), beat("b", "new", base="llama-next"))
    assert select_pool(live, "llama-next", 16).pool == "new"
    with pytest.raises(NoPoolError):
        select_pool(live, "mistral", None)


def test_base_requests_take_the_largest_pool_of_that_base():
    live = view(beat("a", "r16"), beat("b", "r64", rank=64), beat("c", "r64", rank=64))
    assert select_pool(live, "llama", None).pool == "r64"
    assert select_pool(view(beat("a", "r16"), beat("b", "r64", rank=64)), "llama", None).pool == "r16"


def test_stale_heartbeats_are_not_live():
    beats = [beat("fresh", "p", ts=100.0), beat("stale", "p", ts=80.0)]
    assert set(live_workers(beats, now=105.0, staleness_s=10.0)) == {"fresh"}
    with pytest.raises(NoPoolError):
        select_pool(live_workers(beats, now=200.0, staleness_s=10.0), "llama", None)


async def test_pool_view_reports_workers_that_went_stale_or_vanished():
    from services.gateway.pool_view import PoolView

    clock = {"now": 100.0}
    gone: list[set[str]] = []
    view = PoolView(None, staleness_s=3.0, clock=lambda: clock["now"], on_dead=gone.append)
    beats = {"a": beat("a", "p", ts=100.0), "b": beat("b", "p", ts=100.0)}

    async def read():
        return dict(beats)

    view._read = read
    await view.refresh()
    assert set(view.live) == {"a", "b"} and gone == []
    clock["now"] = 105.0  # both stale now; "a" beats again, "b" does not (killed)
    beats["a"] = beat("a", "p", ts=105.0)
    await view.refresh()
    assert gone == [{"b"}]
    del beats["b"]  # its key expires later: not reported twice
    await view.refresh()
    assert gone == [{"b"}] and set(view.live) == {"a"}


async def test_a_blind_view_holds_its_workers_and_gives_them_a_window_to_beat_again():
    """A broker outage is not the death of every worker: while the bucket cannot be read the view
    keeps whom it knew, and after it can read again each gets one staleness window to beat."""
    from services.gateway.pool_view import PoolView

    clock = {"now": 100.0}
    gone: list[set[str]] = []
    view = PoolView(None, staleness_s=3.0, poll_s=0.5, clock=lambda: clock["now"], on_dead=gone.append)
    beats = {"a": beat("a", "p", ts=100.0), "b": beat("b", "p", ts=100.0)}
    failing = {"now": False}

    async def read():
        if failing["now"]:
            raise ConnectionError("broker away")
        return dict(beats)

    view._read = read
    await view.refresh()
    failing["now"] = True
    clock["now"] = 100.5  # the next poll fails: the view goes blind (the poll loop calls blind())
    with pytest.raises(ConnectionError):
        await view.refresh()
    view.blind()
    clock["now"] = 115.0  # a 15 s outage: every beat is stale by now
    assert set(view.live) == {"a", "b"}, "held while blind"
    assert view.select("llama", 16).workers == ("a", "b")
    # Back: the bucket was lost with the restart and is empty; "a" beats first, "b" never does.
    failing["now"] = False
    beats.clear()
    await view.refresh()
    assert gone == [] and set(view.live) == {"a", "b"}
    beats["a"] = beat("a", "p", ts=116.0)
    clock["now"] = 116.0
    await view.refresh()
    assert gone == []
    clock["now"] = 119.0  # the window (staleness + one poll) is over
    beats["a"] = beat("a", "p", ts=119.0)
    await view.refresh()
    assert gone == [{"b"}] and set(view.live) == {"a"}


async def test_a_replica_that_has_not_caught_up_does_not_empty_the_pool():
    """Listed by the stream's leader, then 'not found' by a direct get answered by a replica still
    catching up (a cluster node just restarted): the worker keeps its last beat; only a delete marker
    (a drain) removes it at once."""
    from types import SimpleNamespace

    from nats.js.errors import KeyNotFoundError

    from services.gateway.pool_view import PoolView

    clock = {"now": 100.0}
    gone: list[set[str]] = []
    view = PoolView(None, staleness_s=3.0, clock=lambda: clock["now"], on_dead=gone.append)
    answers = {"a": beat("a", "p", ts=100.0), "b": beat("b", "p", ts=100.0)}

    async def get(key):
        answer = answers[key]
        if isinstance(answer, Exception):
            raise answer
        return SimpleNamespace(value=answer.model_dump_json().encode())

    async def keys():
        return sorted(answers)

    view._kv, view._keys = SimpleNamespace(get=get), keys
    await view.refresh()
    assert set(view.live) == {"a", "b"}
    clock["now"] = 101.0
    answers["a"] = KeyNotFoundError()  # the lagging replica
    answers["b"] = KeyNotFoundError(None, "DEL")  # "b" drained and deleted its key
    await view.refresh()
    assert set(view.live) == {"a"} and gone == [{"b"}]
    clock["now"] = 104.0  # "a" stays unreadable past the staleness window: it is gone after all
    await view.refresh()
    assert gone == [{"b"}, {"a"}]


async def test_a_bucket_that_lost_its_keys_does_not_empty_the_pool():
    """A cluster node that led the memory bucket rejoined empty: the listing has no keys while every
    beat is still fresh. The workers stay until their beats go stale; they beat again in time."""
    from services.gateway.pool_view import PoolView

    clock = {"now": 100.0}
    gone: list[set[str]] = []
    view = PoolView(None, staleness_s=3.0, clock=lambda: clock["now"], on_dead=gone.append)
    listed = {"a": beat("a", "p", ts=100.0), "b": beat("b", "p", ts=100.0)}

    async def read():
        return dict(listed)

    view._read = read
    await view.refresh()
    listed.clear()  # the bucket came back empty
    clock["now"] = 101.0
    await view.refresh()
    assert set(view.live) == {"a", "b"} and gone == []
    listed["a"] = beat("a", "p", ts=101.5)  # "a" beats again into the new leader; "b" never does
    clock["now"] = 103.5
    await view.refresh()
    assert set(view.live) == {"a"} and gone == [{"b"}]
