"""A `FleetSnapshot` drawn with rich: what `lpx top` shows each second, and `lpx adapter where`'s table."""

from __future__ import annotations

import time
from collections.abc import Sequence

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from libs.fleetview.snapshot import FleetSnapshot, Placement, StreamDepth

TIER_LABEL = {"gpu": "gpu", "cpu": "cpu", "disk": "disk", "object_store": "s3"}


def ago(seconds: float) -> str:
    """A duration in its two largest units: 4s, 3m12s, 2h05m, 3d04h."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def rate(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}" if value < 100 else f"{value:.0f}"


def of(used: int, limit: int) -> str:
    """`used/limit`, or `used` alone when the limit is unknown (0)."""
    return f"{used}/{limit}" if limit else str(used)


def _table(title: str, *columns: str, text_columns: int = 1) -> Table:
    """A table whose first `text_columns` columns are names (left) and the rest numbers (right)."""
    table = Table(title=title, title_justify="left")
    for i, column in enumerate(columns):
        table.add_column(column, justify="left" if i < text_columns else "right")
    return table


def render_top(snap: FleetSnapshot, *, hint: str = "") -> RenderableType:
    """The whole frame; `hint` (e.g. how to quit) goes at the end of the header line."""
    parts = [_header(snap, hint), *(Text(f"! {note}", style="yellow") for note in snap.notes)]
    parts += [_workers(snap), _pools(snap), _adapters(snap), _tenants(snap), _queues(snap.streams)]
    return Group(*(part for part in parts if part is not None))


def _header(snap: FleetSnapshot, hint: str) -> Text:
    pools, gateways = len(snap.pools), len(snap.gateways)
    text = Text("lpx top", style="bold")
    text.append(
        f"  {snap.nats_url}  {len(snap.workers)} workers in {pools} pool{'s' * (pools != 1)}, "
        f"{gateways} gateway{'s' * (gateways != 1)} reporting  "
        f"{time.strftime('%H:%M:%S', time.localtime(snap.taken_at))}"
    )
    if hint:
        text.append(f"  ({hint})", style="dim")
    return text


def _workers(snap: FleetSnapshot) -> RenderableType:
    if not snap.workers:
        return Text("no live workers (no heartbeat in the lpx_workers bucket)", style="dim")
    table = _table(
        "workers",
        "worker",
        "pool",
        "in flight",
        "queued",
        "passed",
        "batch",
        "gpu slots",
        "cpu",
        "disk",
        "placed",
        "tok/s",
        "hit % gpu/cpu/disk/s3",
        "beat",
        text_columns=2,
    )
    for w in snap.workers:
        hits = "/".join(f"{100 * w.hit_rates.get(tier, 0):.0f}" for tier in TIER_LABEL) if w.hit_rates else "-"
        gpu, cpu = of(w.gpu_adapters, w.max_loras), of(w.cpu_adapters, w.max_cpu_loras)
        table.add_row(
            w.worker_id,
            w.pool,
            of(w.in_flight, w.capacity),
            str(w.queued),
            str(w.passed_on),
            of(w.batch_running, w.batch_limit) if w.batch_limit else "-",
            gpu,
            cpu,
            str(w.disk_adapters),
            placed(w),
            rate(w.tok_s),
            hits,
            ago(w.beat_age_s),
        )
    return table


def placed(w) -> str:
    """Owned adapters on disk / owned (+ still to fetch): its share of the ring, as placement sees it."""
    if not w.placement_owned:
        return "-"
    backlog = f" +{w.placement_backlog}" if w.placement_backlog else ""
    return f"{w.placement_resident}/{w.placement_owned}{backlog}"


def _pools(snap: FleetSnapshot) -> RenderableType | None:
    if len(snap.pools) < 2:
        return None  # one pool (or none): the workers table says it all
    table = _table("pools", "pool", "workers", "in flight", "queued", "tok/s")
    for p in snap.pools:
        table.add_row(p.pool, str(p.workers), of(p.in_flight, p.capacity), str(p.queued), rate(p.tok_s))
    return table


def where_cell(placements: Sequence[Placement], now: float) -> str:
    """`worker tier age` for each holder, e.g. `sim-0 gpu 13s, sim-1 disk 4m02s`."""
    cells = []
    for p in placements:
        since = f" {ago(now - p.since)}" if p.since is not None else ""
        cells.append(f"{p.worker_id} {TIER_LABEL[p.tier.value]}{since}")
    return ", ".join(cells) or "not resident"


def _adapters(snap: FleetSnapshot) -> RenderableType:
    if not snap.adapters:
        return Text("no adapter requests counted by the workers yet", style="dim")
    table = _table("hottest adapters", "adapter", "req/s", "requests", "resident on (worker, tier, for)")
    table.columns[-1].justify = "left"
    for a in snap.adapters:
        table.add_row(a.name or a.digest[:12], rate(a.req_s), str(a.requests), where_cell(a.placements, snap.taken_at))
    return table


def _tenants(snap: FleetSnapshot) -> RenderableType:
    if not snap.tenants:
        # A gateway reports only while it admits requests: silence is an idle fleet as often as no gateway.
        why = "idle gateways, none up, or LPX_GATEWAY_LIMIT_SYNC_S=0"
        return Text(f"tenants: no requests admitted in the last {snap.window_s:.1f}s ({why})", style="dim")
    statuses = sorted({status for t in snap.tenants for status in t.by_status})
    table = _table("tenants", "tenant", "req/s", "in flight", *(f"HTTP {s}/s" for s in statuses))
    for t in snap.tenants:
        table.add_row(t.tenant, rate(t.req_s), str(t.in_flight), *(rate(t.by_status.get(s)) for s in statuses))
    return table


def _queues(streams: Sequence[StreamDepth]) -> RenderableType:
    if not streams:
        return Text("no platform streams on this broker yet", style="dim")
    table = _table("queues", "stream", "consumer", "messages", "pending", "in progress", text_columns=2)
    for stream in streams:
        table.add_row(stream.stream, "", str(stream.messages), "", "")
        # Idle consumers are left out: a fleet has one per worker, and the busy ones are the news.
        for c in stream.consumers:
            if c.pending or c.ack_pending:
                table.add_row("", c.name, "", str(c.pending), str(c.ack_pending))
    return table


def render_where(
    title: str, placements: Sequence[Placement], now: float, unlisted: Sequence[str] = ()
) -> RenderableType:
    maybe = (
        f"{', '.join(unlisted)} list only their most recent disk adapters: they may hold it on disk too"
        if unlisted
        else ""
    )
    if not placements:
        return Text(f"{title}: not resident on any live worker" + (f" ({maybe})" if maybe else ""))
    table = _table(title, "worker", "pool", "tier", "since", "for", "requests", text_columns=4)
    for p in placements:
        known = p.since is not None
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(p.since)) if known else "-"
        requests = "-" if p.requests is None else str(p.requests)
        table.add_row(
            p.worker_id, p.pool, TIER_LABEL[p.tier.value], since, ago(now - p.since) if known else "-", requests
        )
    if maybe:
        table.caption = maybe
    return table
