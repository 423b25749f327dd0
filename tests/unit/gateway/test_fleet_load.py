"""The pool's load as a gateway replica sees it: heartbeats plus its own requests since."""

from libs.contracts import WorkerHeartbeat
from services.gateway.fleet_load import FleetLoad


class Clock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def beat(worker: str, in_flight: int, queued: int, ts: float) -> WorkerHeartbeat:
    return WorkerHeartbeat(
        worker_id=worker, pool="p", base_model="b", max_rank=16, capacity=16, in_flight=in_flight, queued=queued, ts=ts
    )


def test_other_gateways_work_counts_through_the_heartbeat():
    fleet = FleetLoad(clock=Clock())
    beats = {"w1": beat("w1", in_flight=7, queued=3, ts=99.0), "w2": beat("w2", in_flight=0, queued=0, ts=99.0)}
    # This gateway has nothing in flight; another replica loaded w1 with 10.
    assert fleet.loads(["w1", "w2"], beats, local={}) == {"w1": 10, "w2": 0}


def test_own_requests_after_the_heartbeat_are_added_and_answers_subtracted():
    clock = Clock(100.0)
    fleet = FleetLoad(clock=clock)
    fleet.sent("w1")  # at 100: before the heartbeat below, so already in its in_flight
    clock.now = 101.0
    beats = {"w1": beat("w1", in_flight=4, queued=0, ts=100.5)}
    fleet.sent("w1")
    fleet.sent("w1")
    assert fleet.loads(["w1"], beats, local={"w1": 3}) == {"w1": 6}
    fleet.answered("w1")  # the first one (counted by the heartbeat) finished
    assert fleet.loads(["w1"], beats, local={"w1": 2}) == {"w1": 5}


def test_without_a_heartbeat_or_below_own_count_the_local_count_is_the_floor():
    fleet = FleetLoad(clock=Clock())
    beats = {"w1": beat("w1", in_flight=0, queued=0, ts=50.0)}
    assert fleet.loads(["w1", "w9"], beats, local={"w1": 2, "w9": 4}) == {"w1": 2, "w9": 4}


def test_old_events_are_forgotten():
    clock = Clock(0.0)
    fleet = FleetLoad(horizon_s=10, clock=clock)
    for _ in range(5):
        fleet.sent("w1")
    clock.now = 20.0
    fleet.sent("w1")
    assert fleet.since("w1", -1.0) == 1


def test_a_fresher_load_report_replaces_the_heartbeat_as_the_base():
    clock = Clock(100.0)
    fleet = FleetLoad(clock=clock)
    beats = {"w1": beat("w1", in_flight=2, queued=1, ts=99.0)}
    fleet.reported("w1", in_flight=9, ts=99.5)  # another gateway loaded it since the heartbeat
    assert fleet.loads(["w1"], beats, local={}) == {"w1": 9}
    fleet.sent("w1")  # ours, after the report
    assert fleet.loads(["w1"], beats, local={"w1": 1}) == {"w1": 10}
    fleet.reported("w1", in_flight=1, ts=99.2)  # a late, older report changes nothing
    assert fleet.loads(["w1"], beats, local={"w1": 1}) == {"w1": 10}


def test_an_answer_is_subtracted_at_the_workers_stamp_not_twice():
    """The worker stops counting a request at its result's stamp and reports its load after it; the
    gateway subtracts its answer at that stamp, so a report sent after the stamp is not lowered again."""
    clock = Clock(100.0)
    fleet = FleetLoad(clock=clock)
    fleet.sent("w1")
    fleet.sent("w1")
    fleet.reported("w1", in_flight=2, ts=100.1)
    clock.now = 101.0
    fleet.reported("w1", in_flight=1, ts=100.6)  # one stamped at 100.5, reported at 100.6, answer here at 101
    fleet.answered("w1", at=100.5)
    assert fleet.loads(["w1"], {}, local={"w1": 1}) == {"w1": 1}
    # The answer arrives before the report that leaves it out: subtracted until that report comes.
    clock.now = 102.0
    fleet.answered("w1", at=101.5)
    assert fleet.loads(["w1"], {}, local={}) == {"w1": 0}
    fleet.reported("w1", in_flight=0, ts=101.6)
    assert fleet.loads(["w1"], {}, local={}) == {"w1": 0}
    # A stamp ahead of this gateway's clock (another host's skew) counts as now.
    fleet.sent("w1")
    fleet.answered("w1", at=500.0)
    assert fleet.since("w1", 101.9) == 0 and fleet.since("w1", 102.0) == 0


def test_out_of_order_stamps_count_as_a_full_scan_would():
    """Answers stamped before later sends (the worker's `load_left_at`) are kept in time order, so the
    scan that stops at `ts` counts exactly what a scan of every event would."""
    import random

    rng = random.Random(7)
    clock = Clock(1000.0)
    fleet = FleetLoad(clock=clock)
    stamps: list[tuple[float, int]] = []
    for _ in range(2000):
        clock.now += rng.uniform(0.0, 0.02)
        if rng.random() < 0.5:
            fleet.sent("w1")
            stamps.append((clock.now, +1))
        else:
            at = clock.now - rng.uniform(0.0, 0.2)
            fleet.answered("w1", at=at)
            stamps.append((at, -1))
        ts = clock.now - rng.uniform(0.0, 3.0)
        assert fleet.since("w1", ts) == sum(d for a, d in stamps if a > ts)
