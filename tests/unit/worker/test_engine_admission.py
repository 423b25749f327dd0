"""Engine-queued admission: everything goes to the engine at once; the guard holds newcomers of other
adapters only while an adapter request has waited past the bound without starting."""

import asyncio

import pytest

from services.worker.engine_admission import EngineAdmission


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Harness:
    """Requests as tasks: admitted, then started (first token) and finished when the test says."""

    def __init__(self, admission: EngineAdmission) -> None:
        self.admission = admission
        self.admitted: list[str] = []
        self.waits: dict[str, float] = {}
        self._start: dict[str, asyncio.Event] = {}
        self._finish: dict[str, asyncio.Event] = {}
        self.tasks: dict[str, asyncio.Task] = {}

    def submit(self, name: str, key: str | None) -> None:
        self._start[name], self._finish[name] = asyncio.Event(), asyncio.Event()
        self.tasks[name] = asyncio.create_task(self._run(name, key))

    async def _run(self, name: str, key: str | None) -> None:
        async with self.admission.admitted(key) as ticket:
            self.admitted.append(name)
            self.waits[name] = ticket.waited
            await self._start[name].wait()
            ticket.started()
            await self._finish[name].wait()

    async def start(self, *names: str) -> None:
        for name in names:
            self._start[name].set()
        await settle()

    async def finish(self, *names: str) -> None:
        for name in names:
            self._start[name].set()
            self._finish[name].set()
        await asyncio.gather(*(self.tasks[n] for n in names))
        await settle()


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_more_adapters_than_slots_all_go_to_the_engine_at_once():
    h = Harness(EngineAdmission(max_wait_s=2.0, clock=Clock()))
    for name, key in [("a1", "A"), ("b1", "B"), ("c1", "C"), ("d1", "D"), ("base", None), ("c2", "C")]:
        h.submit(name, key)
    await settle()
    assert h.admitted == ["a1", "b1", "c1", "d1", "base", "c2"]  # vLLM's scheduler queues them, not the worker
    assert set(h.waits.values()) == {0.0}
    assert h.admission.waiting == 0 and h.admission.stats.aged_admissions == 0


async def test_an_aged_request_holds_newcomers_of_other_adapters_until_it_starts():
    clock = Clock()
    h = Harness(EngineAdmission(max_wait_s=2.0, clock=clock))
    h.submit("a1", "A")  # holds a slot and keeps getting traffic
    h.submit("c1", "C")  # waits in the engine for a slot
    await settle()
    await h.start("a1")
    clock.now = 2.5  # c1 has waited past the bound without a first token
    h.submit("a2", "A")  # the slot holder's newcomer: held, so A's batch runs dry
    h.submit("base", None)  # the base model needs no slot: never held
    h.submit("c2", "C")  # behind a2 in arrival order
    await settle()
    assert h.admitted == ["a1", "c1", "base"]
    assert h.admission.waiting == 2
    assert h.admission.oldest_wait_s() == pytest.approx(2.5)
    clock.now = 4.0
    await h.finish("a1")  # A's slot frees; vLLM gives it to c1, the oldest waiting
    assert h.admitted == ["a1", "c1", "base"]  # still held: c1 has not started
    await h.start("c1")
    assert h.admitted == ["a1", "c1", "base", "a2", "c2"]  # released in arrival order
    assert h.waits["a2"] == pytest.approx(1.5)
    assert h.admission.stats.aged_admissions == 2
    assert h.admission.stats.longest_wait_s == pytest.approx(1.5)
    await h.finish("c1", "base", "a2", "c2")
    assert h.admission.waiting == 0 and h.admission.oldest_wait_s() == 0.0


async def test_newcomers_of_the_aged_adapter_are_not_held():
    clock = Clock()
    h = Harness(EngineAdmission(max_wait_s=1.0, clock=clock))
    h.submit("c1", "C")
    await settle()
    clock.now = 1.5
    h.submit("c2", "C")  # joins its own adapter's wait in the engine
    await settle()
    assert h.admitted == ["c1", "c2"]
    await h.finish("c1", "c2")


async def test_a_request_that_ends_without_starting_releases_the_held():
    """An engine error before the first token must not leave newcomers held for ever."""
    clock = Clock()
    h = Harness(EngineAdmission(max_wait_s=1.0, clock=clock))
    h.submit("c1", "C")
    await settle()
    clock.now = 2.0
    h.submit("b1", "B")
    await settle()
    assert h.admitted == ["c1"]
    h.tasks["c1"].cancel()  # the request failed or was abandoned before its first token
    await settle()
    assert h.admitted == ["c1", "b1"]
    await h.finish("b1")


async def test_a_held_request_that_is_cancelled_is_forgotten():
    clock = Clock()
    h = Harness(EngineAdmission(max_wait_s=1.0, clock=clock))
    h.submit("c1", "C")
    await settle()
    clock.now = 2.0
    h.submit("b1", "B")
    h.submit("d1", "D")
    await settle()
    h.tasks["b1"].cancel()
    await settle()
    assert h.admission.waiting == 1
    await h.start("c1")
    assert h.admitted == ["c1", "d1"]
    await h.finish("c1", "d1")
    assert h.admission.waiting == 0
