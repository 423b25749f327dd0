"""The worker's load reports around a request's end (services/worker/app.py `_handle`): the pool hears
that the request leaves, flushed to the broker, before its result is stamped, while the worker's own
count (what its load bound checks) keeps it until the stamp."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from libs.contracts import WorkerLoad
from services.worker.app import Worker
from services.worker.bounded_take import Capacity


class _Link:
    def __init__(self) -> None:
        self.events: list[tuple[str, int | None]] = []

    async def publish(self, subject: str, data: bytes) -> None:
        self.events.append(("report", WorkerLoad.model_validate_json(data).in_flight))

    async def flush(self, timeout: float) -> None:
        self.events.append(("flush", None))


class _Processor:
    """Answers like the real one: the leaving hook, the stamp, the own-count hook, the publish."""

    generated_tokens = 0

    def __init__(self, worker: Worker, link: _Link) -> None:
        self.worker, self.link, self.own_counts = worker, link, {}

    async def handle(self, msg, on_result, taken_at, on_leaving) -> None:
        self.own_counts["before"] = self.worker.in_flight
        left_at = await on_leaving()
        self.own_counts["leaving"] = self.worker.in_flight
        self.link.events.append(("stamp", None))
        await on_result()
        self.own_counts["stamped"] = self.worker.in_flight
        assert left_at is not None


def _worker() -> tuple[Worker, _Link, _Processor]:
    worker = object.__new__(Worker)
    link = _Link()
    counter = SimpleNamespace(add=lambda *_: None)
    worker.worker_id, worker.settings, worker.nc = "w1", SimpleNamespace(pool="p"), link
    worker.bound = object()  # the workers' load bound on (the default)
    worker.metrics = SimpleNamespace(in_flight=counter)
    worker.capacity, worker.answering, worker.leaving, worker._token_window = Capacity(4), 0, 0, []
    worker.processor = _Processor(worker, link)
    return worker, link, worker.processor


async def test_the_pool_is_told_before_the_stamp_and_the_own_count_drops_at_it():
    worker, link, processor = _worker()
    worker.capacity.take(2)  # this request and one more
    await worker._handle(SimpleNamespace(subject="s"))
    assert link.events[:3] == [("report", 1), ("flush", None), ("stamp", None)]
    assert processor.own_counts == {"before": 2, "leaving": 2, "stamped": 1}
    assert worker.in_flight == worker.reported_in_flight == 1 and worker.leaving == worker.answering == 0
    assert ("report", 1) not in link.events[3:]  # nothing changed for the pool after the stamp


async def test_a_request_failing_after_the_report_is_counted_back_out_once():
    worker, link, processor = _worker()
    worker.capacity.take(1)

    async def fails(msg, on_result, taken_at, on_leaving) -> None:
        await on_leaving()
        raise RuntimeError("the result could not be published")

    processor.handle = fails
    await asyncio.wait_for(worker._handle(SimpleNamespace(subject="s")), 5)
    assert worker.leaving == worker.answering == worker.in_flight == 0
    assert link.events[-1] == ("report", 0)


async def test_without_the_workers_bound_the_report_is_not_flushed():
    worker, link, _ = _worker()
    worker.bound = None  # LPX_WORKER_LOAD_BOUND=false: no other worker reads the report to take work
    worker.capacity.take(1)
    await worker._handle(SimpleNamespace(subject="s"))
    assert link.events[:2] == [("report", 0), ("stamp", None)]
