"""libs.eventloop: the services' processes run on uvloop where it is installed (as `vllm serve` does), and on
asyncio's own loop where it is not."""

from __future__ import annotations

import asyncio
import builtins
import subprocess
import sys

import pytest

from libs import eventloop


async def _loop_module() -> str:
    await asyncio.sleep(0)
    return type(asyncio.get_running_loop()).__module__


def _run_in_fresh_process(code: str) -> str:
    # Out of pytest's own running loop: eventloop.run, like asyncio.run, refuses to nest.
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.strip()


def test_a_service_runs_on_uvloop_where_it_is_installed():
    pytest.importorskip("uvloop")
    code = (
        "import asyncio; from libs import eventloop\n"
        "async def main(): return type(asyncio.get_running_loop()).__module__\n"
        "print(eventloop.run(main()))"
    )
    assert _run_in_fresh_process(code).startswith("uvloop")


def test_without_uvloop_it_runs_on_asyncios_loop(monkeypatch):
    real_import = builtins.__import__

    def no_uvloop(name, *args, **kwargs):
        if name == "uvloop":
            raise ImportError("not installed here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_uvloop)
    ran = {}

    def fake_asyncio_run(main):
        ran["main"] = main
        main.close()
        return "asyncio"

    monkeypatch.setattr(eventloop.asyncio, "run", fake_asyncio_run)
    assert eventloop.run(_loop_module()) == "asyncio" and ran


async def test_end_if_cancelling_raises_only_in_a_task_being_cancelled():
    eventloop.end_if_cancelling()  # not being cancelled: nothing happens
    reached = []

    async def swallows_then_checks() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            pass  # the cancel is swallowed, the task's cancelling() count remains
        reached.append("after")
        eventloop.end_if_cancelling()
        reached.append("not reached")

    task = asyncio.create_task(swallows_then_checks())
    await asyncio.sleep(0)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert task.cancelled() and reached == ["after"]
