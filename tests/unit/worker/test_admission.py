"""Adapter-aware admission: grouped by adapter, bounded waits, base model never held."""

import asyncio

import pytest

from services.worker.admission import AdapterAdmission


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Harness:
    """Requests as tasks that enter admission and stay admitted until released by the test."""

    def __init__(self, admission: AdapterAdmission) -> None:
        self.admission = admission
        self.order: list[str] = []
        self._release: dict[str, asyncio.Event] = {}
        self.tasks: dict[str, asyncio.Task] = {}

    def submit(self, name: str, key: str | None) -> None:
        self._release[name] = asyncio.Event()
        self.tasks[name] = asyncio.create_task(self._run(name, key))

    async def _run(self, name: str, key: str | None) -> None:
        async with self.admission.admitted(key):
            self.order.append(name)
            await self._release[name].wait()

    async def finish(self, *names: str) -> None:
        for name in names:
            self._release[name].set()
        await asyncio.gather(*(self.tasks[n] for n in names))
        await asyncio.sleep(0)

    def running(self) -> set[str]:
        return {n for n in self.order if not self.tasks[n].done()}


async def settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def test_more_adapters_than_slots_are_admitted_grouped():
    h = Harness(AdapterAdmission(slots=2, max_wait_s=60, clock=Clock()))
    for name, key in [("a1", "A"), ("b1", "B"), ("c1", "C"), ("d1", "D"), ("c2", "C"), ("a2", "A"), ("c3", "C")]:
        h.submit(name, key)
    await settle()
    # A and B take the two slots; A's second request joins A's slot at once.
    assert h.running() == {"a1", "b1", "a2"}
    await h.finish("b1")
    await settle()
    # The freed slot goes to the biggest waiting group (C: 3 requests), all admitted together.
    assert h.running() == {"a1", "a2", "c1", "c2", "c3"}
    await h.finish("a1", "a2")
    await settle()
    assert "d1" in h.running()
    assert h.admission.stats.slot_swaps == 4  # A, B, C, D: one swap per adapter, not per request
    await h.finish("c1", "c2", "c3", "d1")


async def test_base_model_requests_never_wait():
    h = Harness(AdapterAdmission(slots=1, max_wait_s=60, clock=Clock()))
    h.submit("a1", "A")
    h.submit("b1", "B")
    h.submit("base1", None)
    h.submit("base2", None)
    await settle()
    assert h.running() == {"a1", "base1", "base2"}
    await h.finish("a1", "base1", "base2")
    await settle()
    assert h.running() == {"b1"}
    await h.finish("b1")


async def test_aging_bound_stops_a_hot_adapter_from_starving_others():
    clock = Clock()
    h = Harness(AdapterAdmission(slots=1, max_wait_s=2.0, clock=clock))
    h.submit("a0", "A")
    h.submit("b1", "B")  # waits for the only slot
    await settle()
    n = 0
    # A keeps receiving work; before the bound, each new A request joins A's slot.
    for t in (0.5, 1.0, 1.5):
        clock.now = t
        n += 1
        h.submit(f"a{n}", "A")
        await settle()
        assert f"a{n}" in h.running()
        await h.finish(f"a{n - 1}")
    clock.now = 2.5  # b1 has now waited past the bound: A admits no newcomer
    h.submit("a9", "A")
    await settle()
    assert "a9" not in h.running() and "b1" not in h.running()
    await h.finish(f"a{n}")  # A's slot drains -> B is next, ahead of the A request waiting
    await settle()
    assert h.running() == {"b1"}
    assert h.admission.stats.aged_admissions == 1
    assert h.admission.stats.longest_wait_s == pytest.approx(2.5)
    await h.finish("b1")
    await settle()
    assert h.running() == {"a9"}
    await h.finish("a9")


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_no_request_waits_much_past_the_bound_under_a_flood(seed):
    """Random arrivals over 6 adapters (one hot) and 2 slots, each request served for up to 0.8 s of
    simulated time. A request's wait is bounded by the aging bound plus the generations in its way: the
    ones running when it aged, then at most one per slot for each adapter that aged before it (with 5
    other adapters and 2 slots: 3 service times). Nobody is left behind."""
    import random

    rng = random.Random(seed)
    clock, bound, step, longest_service = Clock(), 0.5, 0.05, 0.8
    admission = AdapterAdmission(slots=2, max_wait_s=bound, clock=clock)
    waits: list[float] = []
    done_at: dict[int, float] = {}

    async def request(i: int, key: str) -> None:
        async with admission.admitted(key) as waited:
            waits.append(waited)
            done_at[i] = clock.now + rng.uniform(0.05, longest_service)
            while clock.now < done_at[i]:
                await asyncio.sleep(0)

    tasks = []
    for i in range(400):
        clock.now += step
        if rng.random() < 0.7:  # arrivals faster than the slots serve: a standing queue
            key = "A" if rng.random() < 0.5 else rng.choice("BCDEF")
            tasks.append(asyncio.create_task(request(i, key)))
        await settle()
    while not all(t.done() for t in tasks):
        clock.now += step
        await settle()
    assert admission.waiting == 0 and admission.adapters_running == 0
    assert len(waits) == len(tasks)
    assert max(waits) <= bound + 3 * longest_service + 2 * step, max(waits)
    assert admission.stats.slot_swaps < len(tasks) / 2  # grouped: far fewer swaps than requests
    assert admission.stats.aged_admissions > 0  # the bound was exercised, not just never reached


async def test_a_cancelled_waiter_leaves_no_trace():
    h = Harness(AdapterAdmission(slots=1, max_wait_s=60, clock=Clock()))
    h.submit("a1", "A")
    h.submit("b1", "B")
    await settle()
    h.tasks["b1"].cancel()
    await settle()
    assert h.admission.waiting == 0
    await h.finish("a1")
    assert h.admission.adapters_running == 0


def test_needs_a_slot():
    with pytest.raises(ValueError):
        AdapterAdmission(slots=0, max_wait_s=1)
