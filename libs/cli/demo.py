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
    """Run the platform end to end on local defaults: the base model, `lpx up` (left running
    afterwards), each demo tenant's dataset stored, its adapter trained by the trainer service and
    passed by the eval gate, then one mixed batch through the gateway (OpenAI API), each tenant
    answered by its own adapter, side by side."""
    from rich.table import Table

    from libs.cli.up_cmds import print_ps
    from libs.demo import flow
    from libs.models.bootstrap import fetch
    from libs.up.platform import LocalPlatform, PlanError, UpError

    with console.status(f"1/4 fetching base model {base}..."):
        model = fetch(base)
    console.log(f"base model ready at {model.path}")
    platform = LocalPlatform()
    try:
        with console.status(
            "2/4 the local platform (`lpx up`): stack, registry, trainer, eval gate, worker, gateway..."
        ):
            ends = platform.up(on_event=lambda msg: console.log(msg))
    except (PlanError, UpError) as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(1) from None
    with console.status(
        "3/4 tenants, datasets, training and the eval gate (the first run trains and gates three "
        "adapters: ~4 min on 2 CPU cores)..."
    ):
        answers, fleet = flow.run(platform, log=lambda msg: console.log(msg))
    table = Table(title=f"4/4 one batch, one base model, one adapter per tenant: {flow.QUESTION!r}")
    for col in ("tenant", "model", "answer", "adapter applied", "s"):
        table.add_column(col, overflow="fold", min_width=50 if col == "answer" else None)
    for a in answers:
        table.add_row(a.who, a.model, a.text, (a.digest or "-")[:12], f"{a.seconds:.1f}")
    console.print(table)
    if fleet is not None:
        from libs.fleetview.render import render_top

        console.rule("the fleet during that batch (`lpx top` shows it live)")
        console.print(render_top(fleet))
    print_ps(platform.ps())
    console.print(
        f"The platform keeps running (gateway {ends.gateway_url}/v1, registry {ends.registry_url}): go on with "
        'your own adapter (README "Try it with your own adapter"); `lpx ps` shows it, `lpx down` (or '
        f"[bold]make down[/bold]) stops it. Service logs: {ends.logs}"
    )
