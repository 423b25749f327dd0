"""A drain step that ignores cancellation must not hold the worker's exit (asyncio.wait_for would wait
for it for ever after its timeout: a CI run's worker teardown hung 15 minutes)."""

from __future__ import annotations

import asyncio
import time

from services.worker.app import _bounded


async def _deaf(forever: asyncio.Event) -> None:
    """Swallows every cancellation, like a close that keeps waiting for its flusher."""
    while not forever.is_set():
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            continue


async def test_a_step_that_swallows_cancellation_is_left_behind_at_its_limit():
    forever = asyncio.Event()
    started = time.monotonic()
    assert await _bounded(_deaf(forever), 0.2, "deaf") is False
    assert time.monotonic() - started < 2.0
    forever.set()  # let it end, so the loop closes cleanly


async def test_finished_and_failed_steps():
    async def fine() -> None:
        await asyncio.sleep(0)

    async def broken() -> None:
        raise RuntimeError("no")

    assert await _bounded(fine(), 1.0, "fine") is True
    assert await _bounded(broken(), 1.0, "broken") is False
