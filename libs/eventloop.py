"""The event loop a service's process runs on: uvloop where it is installed, else asyncio's own.

`vllm serve` runs its API server (the AsyncLLM front end: detokenizing, streaming) on uvloop, and the worker
does that same front-end work, so on asyncio's loop it paid more CPU per token than the peer it is compared
with. The gateway and the registry get uvloop from uvicorn (its `loop="auto"`); the services that are not
uvicorn apps start here."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    try:
        import uvloop
    except ImportError:  # an install without it (e.g. a platform uvloop does not build for) runs as before
        return asyncio.run(main)
    return uvloop.run(main)


def end_if_cancelling() -> None:
    """Raise CancelledError when the current task is being cancelled. For a service's background loop
    to call after a step that catches errors: Python 3.11's `asyncio.wait_for` can swallow a cancel that
    arrives as its future completes (fixed in 3.12), and nats-py's requests use it, so the cancel of a
    stopping service may never be raised inside the step. The task's `cancelling()` count still says so."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
