"""`lpx demo`: the platform end to end on local defaults. It grows with every service that lands.

See libs/demo/flow.py for the steps; this module is the command and its output.
"""

from __future__ import annotations

import sys

import typer
from rich.console import Console

# Piped output (CI logs) gets a wide console so the side-by-side answers stay readable.
console = Console(width=None if sys.stdout.isatty() else 160)


def register(app: typer.Typer) -> None:
    app.command()(demo)


def demo(
    base: str = typer.Option("smollm2-135m", help="base model from the catalogue"),
) -> None:
    """Run the platform end to end on local defaults: stack, base model, each demo tenant's dataset
    stored, its adapter trained by the trainer service and passed by the eval gate, a worker and the
    gateway, then one mixed batch through the gateway (OpenAI API), each tenant answered by its own
    adapter, side by side."""
    from rich.table import Table

    from libs.cli.stack import print_status
    from libs.demo import flow
    from libs.models.bootstrap import fetch
    from libs.stack import Stack, StackConfig

    stack = Stack(StackConfig())
    with console.status("1/4 starting the local stack (NATS JetStream, PostgreSQL, S3)..."):
        stack.up(on_event=lambda msg: console.log(msg))
    with console.status(f"2/4 fetching base model {base}..."):
        model = fetch(base)
    console.log(f"base model ready at {model.path}")
    with console.status("3/4 registry, trainer, eval gate, worker, gateway (the first run trains and gates three "
                        "adapters: ~4 min on 2 CPU cores)..."):  # fmt: skip
        answers = flow.run(stack, model.path, log=lambda msg: console.log(msg))
    table = Table(title=f"4/4 one batch, one base model, one adapter per tenant: {flow.QUESTION!r}")
    for col in ("tenant", "model", "answer", "adapter applied", "s"):
        table.add_column(col, overflow="fold", min_width=50 if col == "answer" else None)
    for a in answers:
        table.add_row(a.who, a.model, a.text, (a.digest or "-")[:12], f"{a.seconds:.1f}")
    console.print(table)
    print_status(stack)
    console.print("The stack keeps running; stop it with [bold]make down[/bold] (or `lpx stack down`). "
                  f"Service logs: {flow.lpx_home() / 'demo' / 'logs'}")  # fmt: skip
