"""`python -m services.worker` (or `lpx-worker`): run one worker until SIGTERM/SIGINT, then drain."""

from __future__ import annotations

import asyncio
import signal
import sys

from libs import eventloop
from libs.logs import setup_logging
from services.worker.app import Worker
from services.worker.heartbeat import WorkerIdInUse
from services.worker.settings import WorkerSettings


async def serve(settings: WorkerSettings) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    worker = Worker(settings)
    try:
        await worker.start()
    except WorkerIdInUse as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        await worker.close()
        raise SystemExit(2) from None
    print(f"worker {settings.worker_id} ready (pool {settings.pool})", flush=True)
    try:
        await worker.run_until(stop)
    finally:
        await worker.close()


def main() -> None:
    settings = WorkerSettings.load()
    setup_logging("worker", settings.log_level, settings.log_format)
    eventloop.run(serve(settings))


if __name__ == "__main__":  # vLLM's engine core is a spawned process: keep this guard
    main()
