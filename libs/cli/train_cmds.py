"""`lpx train` and `lpx migrate plan|start|status`: training jobs and base-model migrations.

`lpx train` asks the registry for a training job (which queues a TrainJob through its outbox) and
follows the job's progress events with a progress bar; the trainer pushes the result to the registry
and the eval gate decides. Migrations are
started in the registry, which enqueues one training job per adapter (exactly once, via its outbox).
"""

from __future__ import annotations

import asyncio
import time

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from libs.cli.registry_cmds import _call, _fail, err, out
from libs.planner.training import GPU_UTILISATION, JOB_OVERHEAD_S, training_gpu_hours

migrate_app = typer.Typer(help="Base-model migrations: retrain every adapter on a new base.", no_args_is_help=True)

# Training cost model for `migrate plan` (libs/planner/training.py; printed with its assumptions).
TOKENS_PER_EXAMPLE = 256  # the trainer's max_length
PRICE_PER_GPU_HOUR = 2.50  # the brief's illustrative H100 price


def register(app: typer.Typer) -> None:
    app.command("train")(train)
    app.add_typer(migrate_app, name="migrate")


def train(
    tenant: str = typer.Argument(...),
    dataset: str = typer.Option(..., "--dataset", help="the tenant's dataset name (lpx dataset list)"),
    adapter: str = typer.Option("support", "--adapter", help="adapter to push the new version to"),
    base: str = typer.Option("smollm2-135m", "--base", help="base model to train on"),
    steps: int = typer.Option(30, help="optimizer steps"),
    seed: int = typer.Option(0),
    rank: int = typer.Option(16, help="LoRA rank (the pool policy's max rank)"),
    batch_size: int = typer.Option(4),
    learning_rate: float = typer.Option(2e-3),
    wait_gate: bool = typer.Option(
        True, "--wait-gate/--no-wait-gate", help="after the push, wait for the eval gate's verdict"
    ),
) -> None:
    """Train a LoRA for TENANT from a stored dataset (on the trainer service), with a progress bar.

    The job is requested from the registry (POST /v1/tenants/TENANT/train) with the CLI's registry
    credential, an admin's or the tenant maintainer's, and recorded in the audit trail."""
    body = {
        "dataset": dataset,
        "adapter": adapter,
        "base_model": base,
        "rank": rank,
        "steps": steps,
        "seed": seed,
        "batch_size": batch_size,
        "learning_rate": learning_rate,
    }
    job = _call("POST", f"/v1/tenants/{tenant}/train", json=body)
    err.print(f"job {job['job_id']} queued: {tenant}/{adapter} on {base}, {steps} steps")
    final = asyncio.run(_follow(job["progress_subject"], steps))
    if final is None:
        out.print(f"job {job['job_id']} queued; no NATS connection to follow it (lpx adapter list {tenant})")
        return
    if final.error:
        _fail(f"training failed: {final.error}")
    out.print(f"trained and pushed [bold]{tenant}/{adapter}-v{final.version}[/bold] (sha256 {final.digest[:16]}...)")
    if wait_gate:
        from libs.cli.eval_cmds import _print_report, _wait_for_verdict

        row = _wait_for_verdict(tenant, adapter, final.version, 1800)
        _print_report(row)
        if row["status"] != "active":
            raise typer.Exit(1)


async def _follow(progress_subject: str, steps: int):
    """The job's progress events from the first on (the progress stream keeps them), until done; None
    when NATS cannot be reached with the CLI's credentials."""
    import nats
    from nats.js.api import DeliverPolicy

    from libs.contracts import TrainProgress
    from libs.settings import ConnectionSettings

    conn = ConnectionSettings.load()
    try:
        nc = await nats.connect(
            conn.nats_servers, connect_timeout=5, max_reconnect_attempts=1, **conn.nats_auth("admin")
        )
    except Exception as exc:  # any failure to connect: the job is queued all the same
        err.print(f"cannot follow the job over NATS ({type(exc).__name__}: {exc})")
        return None
    try:
        sub = await nc.jetstream().subscribe(progress_subject, ordered_consumer=True, deliver_policy=DeliverPolicy.ALL)
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(),
            console=err,
        ) as bar:
            task = bar.add_task("waiting for a trainer", total=steps)
            async for msg in sub.messages:
                event = TrainProgress.model_validate_json(msg.data)
                loss = f" loss {event.loss:.3f}" if event.loss is not None else ""
                bar.update(task, completed=event.step, description=f"{event.stage}{loss}")
                if event.done:
                    return event
    finally:
        await nc.drain()


# --- migrations ----------------------------------------------------------------------------------
def _estimate(plan: dict, base_spec: dict, steps: int, batch_size: int = 4) -> tuple[float, float]:
    """(GPU-hours, cost): 6 x params x tokens FLOPs per adapter at a utilisation, plus per-job overhead."""
    per_job = training_gpu_hours(base_spec["params"], steps * batch_size * TOKENS_PER_EXAMPLE)
    jobs = sum(1 for i in plan["items"] if i["dataset"])
    hours = jobs * per_job
    return hours, hours * PRICE_PER_GPU_HOUR


def _base_params(name: str) -> dict:
    """The base's projection parameters (every layer's q, k, v, o, gate, up, down), from its shapes."""
    for row in _call("GET", "/v1/base-models"):
        if row["name"] == name:
            per_layer = sum(i * o for i, o in row["module_shapes"].values())
            return {"params": per_layer * row["num_layers"]}
    _fail(f"unknown base model {name!r} (lpx base list)")


@migrate_app.command("plan")
def migrate_plan(
    from_base: str = typer.Option(..., "--from"),
    to_base: str = typer.Option(..., "--to"),
    steps: int = typer.Option(30, help="training steps per adapter"),
) -> None:
    """How many adapters would be retrained, from which datasets, and the estimated GPU-hours and cost."""
    plan = _call("GET", "/v1/migrations/plan", params={"from_base": from_base, "to_base": to_base})
    table = Table(
        "tenant",
        "adapter",
        "serving",
        "dataset",
        "train examples",
        "note",
        title=f"migration plan {from_base} -> {to_base}",
    )
    for i in plan["items"]:
        table.add_row(
            i["tenant"], i["adapter"], f"v{i['version']}", i["dataset"] or "-", str(i["train_examples"]), i["reason"]
        )
    out.print(table)
    hours, cost = _estimate(plan, _base_params(to_base), steps)
    trainable = sum(1 for i in plan["items"] if i["dataset"])
    out.print(
        f"{trainable} of {len(plan['items'])} adapters retrainable; estimated {hours:.2f} GPU-hours "
        f"(~${cost:.2f} at ${PRICE_PER_GPU_HOUR:.2f}/H100-hour; {steps} steps x {TOKENS_PER_EXAMPLE * 4} tokens, "
        f"{GPU_UTILISATION:.0%} utilisation, {JOB_OVERHEAD_S:.0f}s overhead per job)"
    )


@migrate_app.command("start")
def migrate_start(
    from_base: str = typer.Option(..., "--from"),
    to_base: str = typer.Option(..., "--to"),
    steps: int = typer.Option(30),
    seed: int = typer.Option(0),
    batch_size: int = typer.Option(4),
    by: str = typer.Option("lpx-cli", "--by"),
) -> None:
    """Start retraining every adapter served on --from for --to (trainers pick the jobs up)."""
    status = _call(
        "POST",
        "/v1/migrations",
        json={
            "from_base": from_base,
            "to_base": to_base,
            "steps": steps,
            "seed": seed,
            "batch_size": batch_size,
            "requested_by": by,
        },
    )
    out.print(
        f"migration [bold]{status['id']}[/bold] started: {len(status['items'])} adapters "
        f"({from_base} -> {to_base}); follow it with `lpx migrate status {status['id']}`"
    )


@migrate_app.command("status")
def migrate_status(
    migration_id: str | None = typer.Argument(None, help="default: the latest migration"),
    watch: bool = typer.Option(False, "--watch", help="refresh until the migration is done"),
) -> None:
    """Each tenant's state (training, evaluating, passed, failed) and the tenants that stay on the old base."""
    while True:
        status = _latest(migration_id)
        _print_status(status)
        if not watch or status["done"]:
            return
        time.sleep(5)


def _latest(migration_id: str | None) -> dict:
    if migration_id:
        return _call("GET", f"/v1/migrations/{migration_id}")
    every = _call("GET", "/v1/migrations")
    if not every:
        _fail("no migrations yet")
    return every[-1]


def _print_status(status: dict) -> None:
    colours = {"passed": "green", "failed": "red", "evaluating": "yellow", "training": "cyan"}
    table = Table(
        "tenant",
        "adapter",
        "from",
        "to",
        "state",
        "reason",
        title=f"{status['id']}: {status['from_base']} -> {status['to_base']}",
    )
    for i in status["items"]:
        colour = colours.get(i["state"], "white")
        table.add_row(
            i["tenant"],
            i["adapter"],
            f"v{i['old_version']}",
            f"v{i['new_version']}" if i["new_version"] else "-",
            f"[{colour}]{i['state']}[/{colour}]",
            i["reason"],
        )
    out.print(table)
    counts = ", ".join(f"{k} {v}" for k, v in sorted(status["counts"].items()))
    state = "done" if status["done"] else "running"
    failed = [f"{i['tenant']}/{i['adapter']}" for i in status["items"] if i["state"] == "failed"]
    out.print(f"{state}: {counts}" + (f"; staying on {status['from_base']}: {', '.join(failed)}" if failed else ""))
