"""One drill: start the mixed load, break something once requests are in flight, repair it, and
report what the callers got."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from libs.client import LoraplexClient
from tests.chaos.load import DrillReport, Load, seconds_until_serving


class LogCounter(logging.Handler):
    """Counts warnings and tracebacks logged while a drill runs (every thread: the gateway has its own)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.warnings = 0
        self.tracebacks: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.warnings += 1
        if record.exc_info:
            self.tracebacks.append(f"{record.name}: {record.getMessage()}")


async def run_drill(
    platform,
    name: str,
    *,
    breaks: Callable[[Load], Awaitable[None]],
    repairs: Callable[[Load], Awaitable[None]] | None = None,
    outage_s: float = 0.0,
    min_in_flight: int = 3,
    streamed: int = 0,
) -> tuple[DrillReport, LogCounter]:
    """`breaks(load)` once requests are in flight, `repairs(load)` after `outage_s` (either may add
    requests to the load); then the time until a new request is served, and every answer judged.
    `streamed`: how many of the HTTP requests stream their answer."""
    report = DrillReport(drill=name)
    counter = LogCounter()
    logging.getLogger().addHandler(counter)
    client = await LoraplexClient(platform.connections.nats_url).connect()
    try:
        load = Load(platform, report, streamed_count=streamed)
        await load.start(client)
        jobs = platform.gateway.gateway.dispatcher.jobs
        deadline = time.monotonic() + 30
        while len(jobs) < min_in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # let the workers start generating
        report.notes = f"{len(jobs)} requests in flight at the fault"
        broken_at = time.monotonic()
        await breaks(load)
        if outage_s:
            await asyncio.sleep(outage_s)
        if repairs is not None:
            await repairs(load)
        report.seconds_to_serve_again = await seconds_until_serving(platform, broken_at)
        await load.finish(client)
    finally:
        logging.getLogger().removeHandler(counter)
        await client.close()
    report.notes += f"; {counter.warnings} warnings, {len(counter.tracebacks)} tracebacks logged"
    return report, counter
