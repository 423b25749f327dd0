"""`lpx base ...` and `lpx adapter push|list|show|history|rollback|activate|retire` (registry HTTP API)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import typer
from rich.table import Table

from libs.cli import registry_cmds
from libs.cli.registry_cmds import (
    UPLOAD_CHUNK,
    _call,
    _checked,
    _fail,
    _split,
    adapter_app,
    base_app,
    err,
    out,
    unreachable,
)


def register(app: typer.Typer) -> None:
    """The commands attach to `lpx adapter` and `lpx base` (registry_cmds) when this module is imported."""


# --- base models -------------------------------------------------------------------------------
@base_app.command("register")
def base_register(name: str, path: Path = typer.Argument(..., help="model directory (or its config.json)")) -> None:
    """Record a base model's architecture, module shapes and checksum from its config.json."""
    config_path = path / "config.json" if path.is_dir() else path
    if not config_path.is_file():
        _fail(f"{config_path} not found: PATH must be a model directory with a config.json")
    try:
        config = json.loads(config_path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        _fail(f"{config_path} is not valid JSON: {exc}")
    row = _call("POST", "/v1/base-models", json={"name": name, "config": config})
    out.print(
        f"base [bold]{row['name']}[/bold]: {row['architecture']}, {row['num_layers']} layers, "
        f"checksum {row['checksum'][:16]}..."
    )


@base_app.command("list")
def base_list() -> None:
    """Every base model the registry validates against."""
    table = Table("name", "architecture", "layers", "modules", "checksum")
    for row in _call("GET", "/v1/base-models"):
        table.add_row(
            row["name"],
            row["architecture"],
            str(row["num_layers"]),
            ", ".join(row["module_shapes"]),
            row["checksum"][:16],
        )
    out.print(table)


# --- adapters ----------------------------------------------------------------------------------
@adapter_app.command("push")
def adapter_push(
    ref: str = typer.Argument(..., metavar="TENANT/NAME"),
    path: Path = typer.Argument(..., help="PEFT adapter directory"),
    base: str = typer.Option(..., "--base", help="base model name (lpx base list)"),
    dataset: str | None = typer.Option(
        None, "--dataset", help="the tenant's dataset it was trained from (the gate evaluates its eval split)"
    ),
) -> None:
    """Push a new version (validated by the registry; the same content twice is one version). The eval
    gate evaluates it; it serves once it passes."""
    tenant, name = _split(ref, "name")
    if not path.is_dir():
        _fail(f"{path} is not a directory")
    files = [p for p in sorted(path.iterdir()) if p.is_file()]
    version, created = _push_with_progress(tenant, name, base, files, dataset)
    verb = "registered" if created else "already registered as"
    out.print(
        f"{verb} [bold]{tenant}/{version['alias']}[/bold] (digest {version['digest'][:16]}..., "
        f"rank {version['rank']}, {version['status']})"
    )


def _push_with_progress(
    tenant: str, name: str, base: str, files: list[Path], dataset: str | None = None
) -> tuple[dict, bool]:
    import httpx
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    with registry_cmds._client() as client:  # through the module: tests point it at an in-process app
        form = {"tenant": tenant, "adapter": name, "base_model": base, **({"dataset": dataset} if dataset else {})}
        request = client.build_request(
            "POST", "/v1/adapters", data=form, files=[("files", (p.name, p.read_bytes())) for p in files]
        )
        body = request.read()
        with Progress(
            TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(), console=err
        ) as bar:
            task = bar.add_task(f"uploading {tenant}/{name}", total=len(body))

            def chunks() -> Iterator[bytes]:
                for start in range(0, len(body), UPLOAD_CHUNK):
                    piece = body[start : start + UPLOAD_CHUNK]
                    bar.advance(task, len(piece))
                    yield piece

            try:
                reply = client.send(
                    client.build_request("POST", "/v1/adapters", content=chunks(), headers=dict(request.headers))
                )
            except httpx.HTTPError as exc:
                _fail(unreachable(exc))
    return _checked(reply)["version"], reply.status_code == 201


@adapter_app.command("list")
def adapter_list(tenant: str | None = typer.Argument(None)) -> None:
    """Adapters (of one tenant, or all), with the version their aliases serve."""
    table = Table("tenant", "adapter", "versions", "serving", "aliases")
    for row in _call("GET", "/v1/adapters", params={"tenant": tenant} if tenant else {}):
        serving = f"v{row['current_version']}" if row["current_version"] else "-"
        table.add_row(row["tenant"], row["name"], str(row["latest_number"]), serving, ", ".join(row["aliases"]))
    out.print(table)


@adapter_app.command("show")
def adapter_show(ref: str = typer.Argument(..., metavar="TENANT/ALIAS")) -> None:
    """The version an alias points at (`name` follows the active version, `name-vN` pins N)."""
    tenant, alias = _split(ref, "alias")
    out.print_json(data=_call("GET", f"/v1/tenants/{tenant}/aliases/{alias}"))


@adapter_app.command("history")
def adapter_history(ref: str = typer.Argument(..., metavar="TENANT/NAME")) -> None:
    """Every version of an adapter, oldest first, with its status and why."""
    tenant, name = _split(ref, "name")
    table = Table("version", "status", "serving", "digest", "rank", "base", "created", "reason")
    for v in _call("GET", f"/v1/tenants/{tenant}/adapters/{name}/versions"):
        table.add_row(
            f"v{v['number']}",
            v["status"],
            "*" if v["current"] else "",
            v["digest"][:12],
            str(v["rank"]),
            v["base_model"],
            v["created_at"][:19],
            v["status_reason"],
        )
    out.print(table)


@adapter_app.command("rollback")
def adapter_rollback(
    ref: str = typer.Argument(..., metavar="TENANT/NAME"),
    to: int | None = typer.Option(None, "--to", help="version number (default: the previous active one)"),
) -> None:
    """Move the adapter's aliases back to an earlier active version."""
    tenant, name = _split(ref, "name")
    version = _call("POST", f"/v1/tenants/{tenant}/adapters/{name}/rollback", json={"to_version": to})
    out.print(f"{tenant}/{name} now serves v{version['number']} (digest {version['digest'][:16]}...)")


@adapter_app.command("activate")
def adapter_activate(
    ref: str = typer.Argument(..., metavar="TENANT/NAME"),
    version: int = typer.Argument(...),
    override: bool = typer.Option(False, "--override", help="required: skips the eval gate"),
    actor: str = typer.Option(..., "--actor", help="who takes the decision"),
    reason: str = typer.Option(..., "--reason"),
) -> None:
    """Admin override: activate a version without a passing evaluation (recorded with actor and reason)."""
    if not override:
        _fail("activation without a passing evaluation is an admin override: pass --override explicitly")
    tenant, name = _split(ref, "name")
    body = _call(
        "POST",
        f"/v1/tenants/{tenant}/adapters/{name}/versions/{version}/activate",
        json={"actor": actor, "reason": reason},
    )
    out.print(f"{tenant}/{name}-v{body['number']} is {body['status']} (override by {body['override_by']})")


@adapter_app.command("retire")
def adapter_retire(
    ref: str = typer.Argument(..., metavar="TENANT/NAME"),
    version: int = typer.Argument(...),
    reason: str = typer.Option("", "--reason"),
) -> None:
    """Retire an active version (not the one the aliases serve: roll back first)."""
    tenant, name = _split(ref, "name")
    body = _call("POST", f"/v1/tenants/{tenant}/adapters/{name}/versions/{version}/retire", json={"reason": reason})
    out.print(f"{tenant}/{name}-v{body['number']} is {body['status']}")
