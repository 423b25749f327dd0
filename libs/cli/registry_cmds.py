"""`lpx tenant|adapter|base ...`: the registry's admin CLI, a thin client of its HTTP API.

The registry is found at LPX_REGISTRY_URL (default http://127.0.0.1:8100) and calls carry
LPX_REGISTRY_TOKEN (a registry credential from `lpx tenant token create`: an admin's, or a tenant
maintainer's) or else LPX_REGISTRY_ADMIN_TOKEN (the bootstrap admin token); they may also come from the
stack env file. Refusals print the registry's
own reason and exit with status 1.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import typer
from pydantic import SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict
from rich.console import Console
from rich.table import Table

from libs.paths import lpx_home, platform_env_file, stack_env_file

UPLOAD_CHUNK = 1 << 16
err = Console(stderr=True)
out = Console()

tenant_app = typer.Typer(help="Tenants and their API keys.", no_args_is_help=True)
adapter_app = typer.Typer(help="Adapters: push versions, list, show, history, rollback.", no_args_is_help=True)
base_app = typer.Typer(help="Base models known to the registry.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.command("usage")(usage)
    app.add_typer(tenant_app, name="tenant")
    app.add_typer(adapter_app, name="adapter")
    app.add_typer(base_app, name="base")


class RegistryClientSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LPX_REGISTRY_", extra="ignore")

    url: str = "http://127.0.0.1:8100"
    admin_token: SecretStr | None = None
    # A registry credential (admin or a tenant's maintainer scope): wins over the admin token.
    token: SecretStr | None = None
    timeout_s: float = 120.0


def registry_settings() -> tuple[RegistryClientSettings, dict[str, str]]:
    """The registry's client settings and the credential's headers: the local stack's settings, then
    what `lpx up` wrote (the registry's URL and admin token); the real environment wins over both."""
    env_files = tuple(path for path in (stack_env_file(), platform_env_file()) if path.is_file())
    settings = RegistryClientSettings(_env_file=env_files or None)
    credential = settings.token or settings.admin_token
    headers = {"Authorization": f"Bearer {credential.get_secret_value()}"} if credential else {}
    return settings, headers


def _client():
    import httpx

    settings, headers = registry_settings()
    return httpx.Client(base_url=settings.url, headers=headers, timeout=settings.timeout_s)


def _call(method: str, path: str, **kwargs):
    """One API call; any refusal becomes the registry's message and exit status 1."""
    import httpx

    try:
        with _client() as client:
            reply = client.request(method, path, **kwargs)
    except httpx.HTTPError as exc:
        _fail(unreachable(exc))
    return _checked(reply)


def unreachable(exc: Exception) -> str:
    """Why the registry did not answer, where the CLI looked, and what to do (a stale platform.env, the
    wrong state directory and a stopped platform all end here)."""
    settings, _ = registry_settings()
    env = platform_env_file()
    found = "found" if env.is_file() else "not found"
    return (
        f"cannot reach the registry at {settings.url} ({type(exc).__name__}: {exc}).\n"
        f"Looked in the state directory {lpx_home()} (platform.env {found}; LPX_HOME or a checkout's .lpx "
        "chooses it). If the platform is not running, start it: lpx up"
    )


def _checked(reply):
    if reply.status_code >= 400:
        try:
            body = reply.json()
            code, detail = body.get("error", reply.status_code), body.get("detail", reply.text)
        except ValueError:
            code, detail = reply.status_code, reply.text
        _fail(f"{detail} ({code})")
    return reply.json()


def _fail(message: str):
    err.print(f"[red]refused:[/red] {message}", markup=True, highlight=False, soft_wrap=True)
    raise typer.Exit(1)


def _split(ref: str, what: str) -> tuple[str, str]:
    tenant, sep, name = ref.partition("/")
    if not sep or not tenant or not name:
        _fail(f"expected TENANT/{what.upper()}, got {ref!r}")
    return tenant, name


# --- tenants -----------------------------------------------------------------------------------
@tenant_app.command("create")
def tenant_create(name: str) -> None:
    """Create a tenant and print its API key (shown this once; only its hash is stored)."""
    created = _call("POST", "/v1/tenants", json={"name": name})
    err.print(f"tenant [bold]{created['tenant']}[/bold] created. Its API key (store it now, it is not shown again):")
    typer.echo(created["api_key"])  # one plain line, never wrapped: `lpx tenant create acme > key` must work


@tenant_app.command("list")
def tenant_list() -> None:
    """Every tenant, with its eval threshold and its limits at the gateway."""
    table = Table("tenant", "eval threshold", "req/s", "tokens/min", "in flight", "weight", "created")
    for row in _call("GET", "/v1/tenants"):
        threshold = row.get("eval_threshold")
        table.add_row(
            row["name"],
            "default" if threshold is None else f"{threshold:.2f}",
            *_limits_cells(row),
            row["created_at"][:19],
        )
    out.print(table)


LIMIT_FIELDS = ("rps_limit", "tpm_limit", "concurrency_limit", "fair_weight")
# CLI/API field -> the tenant row's column
_LIMIT_COLUMNS = {"rps": "rps_limit", "tpm": "tpm_limit", "concurrency": "concurrency_limit", "weight": "fair_weight"}


def _limits_cells(row: dict) -> list[str]:
    return [("default" if row.get(field) is None else f"{row[field]:g}") for field in LIMIT_FIELDS]


@tenant_app.command("limits")
def tenant_limits(
    name: str,
    rps: float | None = typer.Option(None, "--rps", help="requests per second (burst: one second's worth)"),
    tpm: int | None = typer.Option(None, "--tpm", help="prompt + completion tokens per minute"),
    concurrency: int | None = typer.Option(None, "--concurrency", help="requests in flight at once"),
    weight: float | None = typer.Option(
        None, "--weight", help="share of a full pool relative to other tenants (default 1: equal shares)"
    ),
    default: bool = typer.Option(False, "--default", help="clear every limit: the pool defaults apply"),
) -> None:
    """Show or set a tenant's limits at the gateway (every gateway applies a change within a second).
    Options not given keep their value; over a limit, a caller gets 429 with Retry-After."""
    current = next((row for row in _call("GET", "/v1/tenants") if row["name"] == name), None)
    if current is None:
        _fail(f"no tenant {name!r}")
    given = {"rps": rps, "tpm": tpm, "concurrency": concurrency, "weight": weight}
    if default or any(v is not None for v in given.values()):
        body = given
        if not default:
            body = {k: v if v is not None else current[_LIMIT_COLUMNS[k]] for k, v in given.items()}
        current = _call("PUT", f"/v1/tenants/{name}/limits", json=body)
    rps_cell, tpm_cell, concurrency_cell, weight_cell = _limits_cells(current)
    weight_cell = "1 (default)" if weight_cell == "default" else weight_cell
    out.print(
        f"tenant {name}: {rps_cell} req/s, {tpm_cell} tokens/min, {concurrency_cell} in flight, "
        f"fair-share weight {weight_cell}"
    )


@tenant_app.command("keys")
def tenant_keys(name: str) -> None:
    """A tenant's API keys and NATS credentials (ids only: the secrets are never stored)."""
    table = Table("key id", "kind", "created", "revoked", "last connected")
    for row in _call("GET", f"/v1/tenants/{name}/keys"):
        table.add_row(
            row["key_id"],
            row.get("kind", "inference"),
            row["created_at"][:19],
            (row["revoked_at"] or "-")[:19],
            (row.get("last_used_at") or "-")[:19],
        )
    out.print(table)


@tenant_app.command("nats-creds")
def tenant_nats_creds(name: str) -> None:
    """Issue a NATS credential for the tenant's async client (libs/client.py): it may publish the tenant's
    submissions and read its own results, nothing else. Printed once; revoke it with `revoke-key`."""
    created = _call("POST", f"/v1/tenants/{name}/nats-credentials")
    err.print(
        f"NATS credential {created['key_id']} for [bold]{name}[/bold] (store it now, it is not shown again). "
        f"Connect to {created['nats_url']} as user {created['nats_user']!r}, or pass it to "
        "LoraplexClient(url, api_key=KEY, nats_credential=CRED):"
    )
    typer.echo(created["credential"])


@tenant_app.command("revoke-key")
def tenant_revoke_key(
    name: str,
    key_id: str = typer.Argument(..., help="from `lpx tenant keys` (the part of the key after the tenant)"),
) -> None:
    """Revoke an API key (every gateway refuses it within about a second) or a NATS credential (its
    connections are cut and it cannot connect again)."""
    row = _call("POST", f"/v1/tenants/{name}/keys/{key_id}/revoke")
    out.print(f"key {row['key_id']} of {name} revoked at {row['revoked_at'][:19]}")


@tenant_app.command("threshold")
def tenant_threshold(
    name: str, value: float | None = typer.Argument(None, help="pass rate 0..1; omit for the gate's default")
) -> None:
    """Set the eval-case pass rate a tenant's new versions need."""
    row = _call("PATCH", f"/v1/tenants/{name}", json={"eval_threshold": value})
    shown = "the gate's default" if row["eval_threshold"] is None else f"{row['eval_threshold']:.2f}"
    out.print(f"tenant {name}: new versions need an eval pass rate of {shown}")


# --- usage -------------------------------------------------------------------------------------
_UNITS = {"m": 1 / 60, "h": 1.0, "d": 24.0}


def _hours(since: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([mhd]?)", since.strip())
    if not match:
        _fail(f"--since {since!r}: expected a duration such as 90m, 24h or 7d")
    return float(match[1]) * _UNITS[match[2] or "h"]


def usage(
    tenant: str,
    since: str = typer.Option("24h", "--since", help="how far back: 90m, 24h, 7d (hours are UTC)"),
) -> None:
    """A tenant's usage per adapter and hour: requests, prompt and completion tokens, errors (each
    request counted once, from the results the workers returned)."""
    found = _call("GET", f"/v1/tenants/{tenant}/usage", params={"since_hours": _hours(since)})
    table = Table(
        "hour (UTC)",
        "adapter",
        "requests",
        "prompt tokens",
        "completion tokens",
        "errors",
        title=f"usage of {tenant} since {found['since'][:16]}",
    )
    for row in found["rows"]:
        table.add_row(
            row["hour"][:13],
            row["adapter"],
            str(row["requests"]),
            str(row["prompt_tokens"]),
            str(row["completion_tokens"]),
            str(row["errors"]),
        )
    totals = found["totals"]
    table.add_row(
        "total",
        "",
        str(totals["requests"]),
        str(totals["prompt_tokens"]),
        str(totals["completion_tokens"]),
        str(totals["errors"]),
        style="bold",
    )
    out.print(table)
    cost = found["cost"]
    out.print(
        f"estimated cost: ${cost['usd']:.4f} for {totals['completion_tokens']} completion tokens at "
        f"${cost['usd_per_million_tokens']:.2f} per 1M tokens = GPU ${cost['gpu_price_per_hour']:g}/h "
        f"({cost['gpu_price_source']}) / {cost['tok_s_per_gpu']:g} tok/s per GPU ({cost['tok_s_source']})"
    )


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

    with _client() as client:
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
