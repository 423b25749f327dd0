"""`lpx tenant ...` and `lpx usage`: tenants, their keys, limits and usage (registry HTTP API)."""

from __future__ import annotations

import re

import typer
from rich.table import Table

from libs.cli.registry_cmds import _call, _fail, err, out, tenant_app


def register(app: typer.Typer) -> None:
    app.command("usage")(usage)


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
