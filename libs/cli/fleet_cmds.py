"""`lpx fleet`: several gateways and many simulated workers on this machine, for load tests by hand.

The workers run the real worker code on the simulated engine (LPX_WORKER_ENGINE=sim: no model, answers
name the applied adapter); gateways are the real gateway. They use the local stack (`lpx stack up`) and
a registry that answers on its NATS (e.g. `lpx-registry` with the stack's env file). `benchmarks/
bench_fleet.py` runs the same fleet with traffic and measures it against the routing simulator.
"""

from __future__ import annotations

import asyncio

import typer
from rich.console import Console
from rich.table import Table

fleet_app = typer.Typer(help=__doc__.splitlines()[0], no_args_is_help=True)
console = Console()


def register(app: typer.Typer) -> None:
    app.add_typer(fleet_app, name="fleet")


def _record_path():
    from libs.paths import lpx_home

    return lpx_home() / "fleet" / "fleet.json"


@fleet_app.command()
def up(
    gateways: int = typer.Option(3, min=1, max=16, help="gateway processes (each on a free port)"),
    workers: int = typer.Option(8, min=1, max=256, help="simulated worker processes"),
    policy: str = typer.Option("bounded_load", help="routing: bounded_load | random | least_loaded | consistent_hash"),
    decode_tok_s: float = typer.Option(50.0, help="simulated decode rate per sequence"),
) -> None:
    """Start the fleet on the running local stack and wait until every gateway sees every worker."""
    from libs.fleet import Fleet, FleetSpec, save
    from libs.stack import Stack, StackConfig

    record = _record_path()
    if record.exists():
        console.print(f"a fleet is already up ({record}); `lpx fleet down` first")
        raise typer.Exit(1)
    stack = Stack(StackConfig())
    if not stack.env_file.exists():
        console.print("[red]the local stack is not up[/red]: run `lpx stack up` first")
        raise typer.Exit(1)
    record.parent.mkdir(parents=True, exist_ok=True)
    fleet = Fleet(
        env_file=stack.env_file, state=record.parent, spec=FleetSpec(routing_policy=policy, decode_tok_s=decode_tok_s)
    )
    urls = fleet.up(gateways, workers)
    save(fleet, record)
    try:
        with console.status(f"starting {gateways} gateways and {workers} simulated workers..."):
            asyncio.run(fleet.wait_ready(workers))
    except (RuntimeError, TimeoutError) as exc:
        console.print(f"[red]the fleet did not come up[/red]: {exc}; logs in {record.parent}")
        raise typer.Exit(1) from None
    console.print(f"fleet up: gateways {', '.join(urls)}; logs in {record.parent}; `lpx fleet down` stops it")


@fleet_app.command()
def status() -> None:
    """Each process of the fleet: pid and whether it runs."""
    import json

    from libs.fleet import alive

    record = _record_path()
    if not record.exists():
        console.print("no fleet is up")
        raise typer.Exit(1)
    data = json.loads(record.read_text())
    table = Table(title="loraplex fleet")
    for col in ("process", "pid", "state", "url"):
        table.add_column(col)
    for name, g in data["gateways"].items():
        table.add_row(name, str(g["pid"]), "running" if alive(g["pid"]) else "gone", g["url"])
    for name, w in data["workers"].items():
        table.add_row(name, str(w["pid"]), "running" if alive(w["pid"]) else "gone", "")
    console.print(table)


@fleet_app.command()
def down() -> None:
    """Stop every process of the fleet (SIGTERM: workers drain; SIGKILL after 30 s)."""
    from libs.fleet import stop_recorded

    record = _record_path()
    if not record.exists():
        console.print("no fleet is up")
        return
    with console.status("stopping the fleet..."):
        stopped = stop_recorded(record)
    console.print(f"stopped {stopped} processes")
