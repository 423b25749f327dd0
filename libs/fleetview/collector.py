"""Samples of the fleet, one `FleetSnapshot` each, with rates between samples (see libs/fleetview/__init__)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

from pydantic import ValidationError

from libs.contracts import LimitReport, subjects
from libs.fleetview import prometheus
from libs.fleetview.names import AdapterNames
from libs.fleetview.rates import BeatHistory, TenantTally
from libs.fleetview.snapshot import FleetSnapshot, build_snapshot
from libs.fleetview.sources import NatsLink, describe, read_heartbeats, read_streams, scrape


class FleetCollector:
    def __init__(
        self,
        nats_url: str,
        *,
        metrics_urls: Sequence[str] = (),
        hottest: int = 10,
        history_s: float = 10.0,
        registry: tuple[str, dict[str, str]] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.link = NatsLink(nats_url)
        self.registry = registry  # (URL, headers): adapter names for the digests; None: digests only
        self.names: AdapterNames | None = None
        self.metrics_urls = list(metrics_urls)
        self.hottest = hottest
        self.history = BeatHistory(history_s)
        self.tally = TenantTally()
        self._clock = clock
        self._scraped: dict[str, tuple[float, prometheus.Counts]] = {}  # url -> (when, counts) last scrape
        self._http = None
        self._registry_http = None
        self._sub = None

    async def start(self, timeout_s: float = 3.0) -> None:
        """Connect and start listening to the gateways' limit reports. FleetUnreachable if NATS is not there."""
        await self.link.connect(timeout_s)
        self._sub = await self.link.nc.subscribe(subjects.GATEWAY_LIMITS_ALL, cb=self._on_report)
        import httpx

        if self.metrics_urls:
            self._http = httpx.AsyncClient(timeout=2.0)
        if self.registry:
            url, headers = self.registry
            self._registry_http = httpx.AsyncClient(base_url=url, headers=headers, timeout=2.0)
            self.names = AdapterNames(self._registry_http)

    async def close(self) -> None:
        for http in (self._http, self._registry_http):
            if http is not None:
                await http.aclose()
        await self.link.close()

    async def _on_report(self, msg) -> None:
        try:
            self.tally.add(LimitReport.model_validate_json(msg.data))
        except ValidationError:
            pass  # a gateway newer or older than this lpx: its tenants are missing from the view

    async def sample(self) -> FleetSnapshot:
        js, notes = self.link.js, []
        read = await read_heartbeats(js)
        self.history.add(read.beats)
        if read.unreadable:
            notes.append(f"{read.unreadable} heartbeat(s) this lpx cannot read (a worker of another version?)")
        streams = await read_streams(js)
        status_rates = await self._status_rates(notes)
        names = await self.names.current(notes) if self.names is not None else None
        return build_snapshot(
            now=self._clock(),
            nats_url=self.link.url,
            pairs=self.history.pairs(),
            tenants=self.tally.take(),
            streams=streams,
            status_rates=status_rates,
            hottest=self.hottest,
            names=names,
            notes=notes,
        )

    async def sample_over(self, window_s: float = 1.0, beat_wait_s: float = 5.0) -> FleetSnapshot:
        """One snapshot with rates, for a one-shot view: a first sample, then a second one `window_s`
        later, or later still (by at most `beat_wait_s`) until every worker has beaten again, so that
        every worker's rates come from two of its heartbeats."""
        await self.sample()
        first = self.history.newest()
        started = time.monotonic()
        await asyncio.sleep(window_s)
        while time.monotonic() - started < window_s + beat_wait_s:
            now = (await read_heartbeats(self.link.js)).beats
            if all(worker not in now or now[worker].ts > beat.ts for worker, beat in first.items()):
                break
            await asyncio.sleep(0.2)
        return await self.sample()

    async def _status_rates(self, notes: list[str]) -> dict[str, dict[str, float]]:
        parts = []
        for url in self.metrics_urls:
            try:
                counts = prometheus.tenant_status_counts(await scrape(self._http, url))
            except Exception as exc:
                notes.append(f"metrics {url}: {describe(exc)}")
                continue
            now = time.monotonic()
            if url in self._scraped:
                then, before = self._scraped[url]
                parts.append(prometheus.status_rates(before, counts, now - then))
            self._scraped[url] = (now, counts)
        return prometheus.merged(parts)
