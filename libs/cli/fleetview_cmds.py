"""`lpx top` and `lpx adapter where`: the serving fleet as its workers' heartbeats and the gateways'
reports show it (libs/fleetview gathers, this module only runs and draws).

Both read NATS at LPX_NATS_URL (or the stack env file, or `--nats`); `adapter where` also asks the
registry which digest an alias stands for. With NATS away they say so in one line and exit 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from dataclasses import asdict

import typer


def register(app: typer.Typer) -> None:
    from libs.cli.registry_cmds import adapter_app

    app.command("top")(top)
    adapter_app.command("where")(adapter_where)


def _nats_url(given: str | None) -> str:
    from libs.settings import ConnectionSettings

    return given or ConnectionSettings.load().nats_url


def _unreachable(command: str, message: str):
    """The one line a script or a person needs; no traceback."""
    typer.echo(f"{command}: {message}", err=True)
    raise typer.Exit(1)


# --- lpx top -------------------------------------------------------------------------------------
def top(
    once: bool = typer.Option(False, "--once", help="print one snapshot and exit (rates over --window)"),
    as_json: bool = typer.Option(False, "--json", help="print one snapshot as JSON and exit (implies --once)"),
    interval: float = typer.Option(1.0, "--interval", min=0.2, help="seconds between refreshes"),
    window: float = typer.Option(1.0, "--window", min=0.1, help="--once: seconds between its two samples"),
    hottest: int = typer.Option(10, "--adapters", min=1, max=200, help="how many of the hottest adapters to show"),
    metrics: list[str] = typer.Option(
        [],
        "--metrics",
        help="a gateway's Prometheus URL (repeatable): adds req/s per tenant and HTTP status "
        "(default: LPX_TOP_METRICS, a JSON list; `lpx up` writes its gateway's)",
    ),
    nats_url: str | None = typer.Option(None, "--nats", help="NATS URL (default: LPX_NATS_URL, the stack env file)"),
    names: bool = typer.Option(
        True,
        "--names/--no-names",
        help="name the hottest adapters (tenant/adapter vN) through the registry at LPX_REGISTRY_URL with its "
        "admin token, asked every 30 s; --no-names: digest prefixes only",
    ),
) -> None:
    """The fleet live: workers, adapter tiers, hottest adapters, tenants, queues (q quits).

    Redrawn every --interval seconds: each worker's pool, requests in flight and queued, adapters in
    its gpu slots and cpu cache against their limits, tok/s and tier hit rates since it started; the
    hottest adapters and where they are resident; req/s and in flight per tenant; JetStream queue depths.

    Rates are differences of two samples: tok/s and adapter req/s between two heartbeats of a worker
    (over the last 10 s of beats), tenant req/s between two samples of the gateways' limit reports.
    """
    from libs.fleetview import FleetCollector, FleetUnreachable

    url = _nats_url(nats_url)
    metrics = metrics or _default_metrics()
    collector = FleetCollector(url, metrics_urls=metrics, hottest=hottest, registry=_registry() if names else None)
    try:
        if once or as_json:
            asyncio.run(_print_once(collector, window, as_json))
        else:
            asyncio.run(_live(collector, interval))
    except FleetUnreachable as exc:
        _unreachable("lpx top", str(exc))
    except KeyboardInterrupt:
        pass  # Ctrl-C is how a view without a terminal on stdin ends


def _default_metrics() -> list[str]:
    """LPX_TOP_METRICS from the environment, or the file `lpx up` writes for the CLI."""
    from pydantic_settings import BaseSettings, SettingsConfigDict

    from libs.paths import platform_env_file

    class TopSettings(BaseSettings):
        model_config = SettingsConfigDict(env_prefix="LPX_TOP_", extra="ignore")

        metrics: list[str] = []

    env_file = platform_env_file()
    return TopSettings(_env_file=env_file if env_file.is_file() else None).metrics


def _registry() -> tuple[str, dict[str, str]]:
    from libs.cli.registry_cmds import registry_settings

    settings, headers = registry_settings()
    return settings.url, headers


async def _print_once(collector, window: float, as_json: bool) -> None:
    from rich.console import Console

    from libs.fleetview import FleetUnreachable
    from libs.fleetview.render import render_top
    from libs.fleetview.sources import describe

    await collector.start()
    try:
        snapshot = await collector.sample_over(window)
    except Exception as exc:
        raise FleetUnreachable(
            f"reading the fleet from NATS at {collector.link.url} failed ({describe(exc)})"
        ) from None
    finally:
        await collector.close()
    if as_json:
        typer.echo(json.dumps(snapshot.to_json(), indent=2))
    else:
        Console().print(render_top(snapshot))


async def _live(collector, interval: float) -> None:
    from rich.console import Console, Group
    from rich.live import Live
    from rich.text import Text

    from libs.fleetview.render import render_top
    from libs.fleetview.sources import describe

    console = Console()
    await collector.start()
    stop = asyncio.Event()
    last = None
    try:
        with (
            _quit_on_q(stop) as keys,
            Live(Text("reading the fleet..."), console=console, auto_refresh=False, screen=console.is_terminal) as live,
        ):
            hint = "q quits" if keys else "Ctrl-C quits"
            while not stop.is_set():
                try:
                    last = await collector.sample()
                    frame = render_top(last, hint=hint)
                except Exception as exc:
                    problem = Text(f"! NATS at {collector.link.url}: {describe(exc)}; retrying", style="red")
                    frame = Group(problem, render_top(last, hint=hint)) if last else problem
                live.update(frame, refresh=True)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), interval)
    finally:
        await collector.close()


@contextlib.contextmanager
def _quit_on_q(stop: asyncio.Event):
    """`q` sets `stop`. Stdin goes to cbreak mode (each key at once, not echoed; Ctrl-C still works) and
    the event loop reads it only when a key is there, so the view never blocks on input. Yields whether
    keys are read: without a terminal on stdin, Ctrl-C is the way out."""
    if not sys.stdin.isatty():
        yield False
        return
    import termios
    import tty

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    loop = asyncio.get_running_loop()

    def on_input() -> None:
        data = os.read(fd, 64)
        if not data:  # stdin closed: nothing more to read, and the reader must not spin on it
            loop.remove_reader(fd)
        elif b"q" in data.lower():
            stop.set()

    tty.setcbreak(fd)
    loop.add_reader(fd, on_input)
    try:
        yield True
    finally:
        loop.remove_reader(fd)
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


# --- lpx adapter where ---------------------------------------------------------------------------
def adapter_where(
    ref: str = typer.Argument(..., metavar="TENANT/ALIAS"),
    as_json: bool = typer.Option(False, "--json", help="print the answer as JSON"),
    nats_url: str | None = typer.Option(None, "--nats", help="NATS URL (default: LPX_NATS_URL, the stack env file)"),
    positions: int = typer.Option(
        2, min=1, help="ring positions that pre-load an adapter: the workers' LPX_WORKER_PLACEMENT_POSITIONS"
    ),
) -> None:
    """Which live workers hold an adapter now, in which tier, since when, and where it is placed.

    The registry resolves the alias to its version's digest; the workers' heartbeats say which of them
    hold that digest in a gpu slot, the cpu cache or on disk, and since when (to a heartbeat interval).
    "placed on": per pool, the worker the ring gives it to (the gateways route it there while it is
    under the load bound) and the next `--positions` - 1 of its ring order (where the bound sends it while
    the first is full); each keeps it on disk ahead of requests.
    """
    import time

    from rich.console import Console

    from libs.cli.registry_cmds import _call, _split
    from libs.fleetview import FleetUnreachable, placements, unlisted_disk
    from libs.fleetview.render import render_where
    from libs.fleetview.snapshot import placed_on

    tenant, alias = _split(ref, "alias")
    version = _call("GET", f"/v1/tenants/{tenant}/aliases/{alias}")
    try:
        beats = asyncio.run(_heartbeats(_nats_url(nats_url)))
    except FleetUnreachable as exc:
        _unreachable("lpx adapter where", str(exc))
    found = placements(beats.values(), version["digest"])
    unlisted = unlisted_disk(beats.values(), version["digest"])
    placed = placed_on(beats.values(), version["digest"], version.get("base_model"), positions)
    if as_json:
        body = {
            "tenant": tenant,
            "alias": alias,
            "adapter": version["adapter"],
            "version": version["number"],
            "status": version["status"],
            "digest": version["digest"],
            "workers": [asdict(p) for p in found],
            "may_hold_on_disk": unlisted,  # workers whose beats list only their most recent disk adapters
            "placed_on": {pool: order[0] for pool, order in placed.items()},  # pool -> its ring owner
            "kept_on": placed,  # pool -> every worker that pre-loads it, its ring owner first
        }
        typer.echo(json.dumps(body, indent=2))
        return
    title = f"{tenant}/{alias} = {version['adapter']} v{version['number']} ({version['digest'][:12]})"
    console = Console()
    console.print(render_where(title, found, time.time(), unlisted))
    for pool, (owner, *spills) in placed.items():
        also = f"; also kept on {', '.join(spills)}, where the load bound sends it next" if spills else ""
        console.print(f"placed on {owner} in pool {pool} (its ring owner: routed there, kept on its disk{also})")


async def _heartbeats(url: str) -> dict:
    from libs.fleetview import FleetUnreachable
    from libs.fleetview.sources import NatsLink, describe, read_heartbeats

    link = NatsLink(url)
    await link.connect()
    try:
        return (await read_heartbeats(link.js)).beats
    except Exception as exc:
        raise FleetUnreachable(f"reading heartbeats from NATS at {url} failed ({describe(exc)})") from None
    finally:
        await link.close()
