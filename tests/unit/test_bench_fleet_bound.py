"""bench_fleet's reconstruction of each worker's load at assignment, and what it keeps of a violation."""

from __future__ import annotations

from benchmarks.fleet_analysis import Sample, assignment_loads
from libs.contracts import InferenceResult, Timings


def _sample(worker: str, taken: float, done: float) -> Sample:
    timings = Timings(fetched_at=taken, queue_s=0.0, result_sent_at=done)
    return Sample(
        "a", True, InferenceResult(request_id=f"{worker}-{taken}", worker_id=worker, ok=True, timings=timings)
    )


def test_a_take_over_the_bound_is_counted_with_the_answer_just_before_it():
    # 2 workers, c = 1.0: w1 holds one, then takes a second while w2's only request ended 5 ms before
    # (pool in flight 1 -> bound ceil(2 / 2) = 1, w1 after taking: 2).
    samples = [_sample("w1", 100.0, 110.0), _sample("w2", 100.0, 101.0), _sample("w1", 101.005, 110.0)]
    loads = assignment_loads(samples, 2, 1.0, at_worker=True)
    assert loads["bound_violations"] == 1
    (detail,) = loads["bound_violation_details"]
    assert detail["worker"] == "w1" and detail["load_after"] == 2 and detail["pool_in_flight"] == 1
    assert detail["bound"] == 1 and detail["bound_one_more_in_flight"] == 2
    assert detail["ms_since_another_worker_answered"] == 5.0


def test_takes_within_the_bound_are_not_violations():
    samples = [_sample("w1", 100.0, 110.0), _sample("w2", 100.5, 110.0), _sample("w1", 101.0, 110.0)]
    loads = assignment_loads(samples, 2, 1.0, at_worker=True)
    assert loads["bound_violations"] == 0 and loads["bound_violation_details"] == []
