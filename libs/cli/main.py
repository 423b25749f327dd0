"""`lpx`: the operator CLI of loraplex.

Each command group lives in its own module and registers itself here; modules import their heavy
dependencies lazily so that `lpx --help` stays fast.
"""

from __future__ import annotations

import typer

from libs.cli import (
    access_cmds,
    adapter_cmds,
    dataset_cmds,
    demo,
    eval_cmds,
    fleet_cmds,
    fleetview_cmds,
    model,
    nats_cmds,
    plan,
    registry_cmds,
    simulate,
    stack,
    tenant_cmds,
    train_cmds,
    up_cmds,
)

app = typer.Typer(
    name="lpx",
    help="loraplex: serve thousands of per-tenant LoRA adapters on one shared base model.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)

for module in (
    up_cmds,
    stack,
    model,
    demo,
    plan,
    simulate,
    registry_cmds,
    tenant_cmds,
    adapter_cmds,
    access_cmds,
    eval_cmds,
    dataset_cmds,
    train_cmds,
    fleet_cmds,
    fleetview_cmds,
    nats_cmds,
):
    module.register(app)


if __name__ == "__main__":
    app()
