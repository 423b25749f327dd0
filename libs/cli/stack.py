"""`lpx stack up|status|down`: the local stack of real servers (NATS JetStream, PostgreSQL, S3)."""

from __future__ import annotations

import signal
import sys

import typer
from rich.console import Console
from rich.table import Table

console = Console(stderr=True)
stack_app = typer.Typer(help="Run NATS JetStream, PostgreSQL and an S3 store locally as real processes (no Docker).")


def register(app: typer.Typer) -> None:
    app.add_typer(stack_app, name="stack")


def _stack(**overrides):
    from libs.stack import Stack, StackConfig

    return Stack(StackConfig(**overrides))


def _raise_on_signal(signum, _frame):
    raise KeyboardInterrupt(f"signal {signum}")


@stack_app.command()
def up(
    nats_nodes: int = typer.Option(
        None,
        "--nats-nodes",
        min=1,
        max=5,
        envvar="LPX_STACK_NATS_NODES",
        help="1: one nats-server. 3: a JetStream cluster on loopback (own store dir, server name and routes "
        "per node; streams and KV buckets with 3 replicas; clients get every node URL). Fixed when the stack "
        "is first created: `lpx stack down --purge` to change it.",
    ),
) -> None:
    """Start the servers that are not running, wait until each is healthy, write the env file.

    Ports default to free ones (kept across restarts); set LPX_STACK_NATS_PORT, LPX_STACK_POSTGRES_PORT,
    LPX_STACK_S3_PORT to pin them. Interrupting `up` stops whatever it had started."""
    from libs.stack import StackError

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise_on_signal)
    stack = _stack(**({"nats_nodes": nats_nodes} if nats_nodes else {}))
    try:
        with console.status("starting the local stack..."):
            stack.up(on_event=lambda msg: console.log(msg))
    except StackError as exc:
        console.print(f"[red]stack up failed:[/red] {exc}")
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: stopped what this call had started[/yellow]")
        raise typer.Exit(130) from None
    print_status(stack)
    console.print(f"client settings written to [bold]{stack.env_file}[/bold]")


@stack_app.command()
def status() -> None:
    """Show each server: pid, health, endpoint. Exit code 1 unless all are healthy."""
    stack = _stack()
    if not print_status(stack):
        raise typer.Exit(1)


@stack_app.command()
def down(
    purge: bool = typer.Option(False, "--purge", help="Also delete all data (databases, objects, streams)."),
) -> None:
    """Stop every server the stack started (tracked by pid). Data is kept unless --purge."""
    stack = _stack()
    stack.down(on_event=lambda msg: console.log(msg))
    if purge:
        stack.purge()
        console.log(f"deleted {stack.dir}")


@stack_app.command()
def env() -> None:
    """Print the client settings (KEY=VALUE), e.g. `eval $(lpx stack env | sed 's/^/export /')`."""
    stack = _stack()
    if not stack.env_file.exists():
        console.print("[red]the stack is not up[/red] (run `lpx stack up`)")
        raise typer.Exit(1)
    lines = stack.env_file.read_text().splitlines(True)
    sys.stdout.write("".join(line for line in lines if not line.startswith("#")))


def print_status(stack) -> bool:
    rows = stack.status()
    table = Table(title=f"loraplex local stack ({stack.dir})")
    for col in ("server", "pid", "state", "endpoint", "log"):
        table.add_column(col)
    for row in rows:
        if row.healthy:
            state = "[green]healthy[/green]"
        else:
            state = "[yellow]unhealthy[/yellow]" if row.running else "[red]stopped[/red]"
        table.add_row(row.name, str(row.pid or "-"), state, row.endpoint, str(row.log))
    Console().print(table if rows else "no stack state: run `lpx stack up`")
    return bool(rows) and all(r.healthy for r in rows)
