"""`lpx tenant token ...`, `lpx tenant value-check` and `lpx audit`: who may act on the registry, what
they did, and the tenant's value check in the eval gate.

Both work with an admin credential or a tenant maintainer's (LPX_REGISTRY_TOKEN, or the bootstrap
LPX_REGISTRY_ADMIN_TOKEN): a maintainer sees and manages its own tenant only.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

import typer
from rich.table import Table

from libs.cli.registry_cmds import _call, _fail, err, out, tenant_app

token_app = typer.Typer(help="Registry credentials: an admin's, or a tenant maintainer's.", no_args_is_help=True)
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def register(app: typer.Typer) -> None:
    tenant_app.add_typer(token_app, name="token")  # and `lpx tenant value-check` (below)
    app.command("audit")(audit)


def _seconds(value: str, option: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd])", value.strip())
    if not match:
        _fail(f"{option} {value!r}: expected a duration such as 90m, 24h or 30d")
    return float(match[1]) * _SECONDS[match[2]]


@token_app.command("create")
def token_create(
    tenant: str | None = typer.Argument(None, help="the maintainer's tenant (omit with --admin)"),
    name: str = typer.Option(..., "--name", help="who or what holds it, e.g. acme-ml-ci"),
    admin: bool = typer.Option(False, "--admin", help="an admin credential (everything; admins only)"),
    expires_in: str | None = typer.Option(None, "--expires-in", help="e.g. 90d, 12h (default: no expiry)"),
) -> None:
    """Create a registry credential and print it (shown this once; only its hash is stored)."""
    if admin == (tenant is not None):
        _fail("name a TENANT for a maintainer credential, or pass --admin (and no tenant) for an admin one")
    body = {"name": name, "scope": "admin" if admin else "maintainer", "tenant": tenant}
    if expires_in is not None:
        body["expires_in_s"] = _seconds(expires_in, "--expires-in")
    made = _call("POST", "/v1/tokens", json=body)
    whose = "admin" if admin else f"maintainer of [bold]{tenant}[/bold]"
    err.print(f"credential {made['token_id']} ({whose}) created. Store it now, it is not shown again:")
    typer.echo(made["token"])  # one plain line: `lpx tenant token create acme --name ci > token` must work


@token_app.command("list")
def token_list(tenant: str | None = typer.Argument(None, help="one tenant's (a maintainer: its own)")) -> None:
    """Registry credentials (ids and names: the secrets are never stored)."""
    table = Table("token id", "name", "scope", "tenant", "created by", "created", "expires", "last used", "revoked")
    for row in _call("GET", "/v1/tokens", params={"tenant": tenant} if tenant else None):
        table.add_row(
            row["token_id"],
            row["name"],
            row["scope"],
            row["tenant"] or "-",
            row["created_by"],
            row["created_at"][:19],
            (row["expires_at"] or "-")[:19],
            (row["last_used_at"] or "-")[:19],
            (row["revoked_at"] or "-")[:19],
        )
    out.print(table)


@token_app.command("revoke")
def token_revoke(token_id: str = typer.Argument(..., help="from `lpx tenant token list`")) -> None:
    """Revoke a registry credential: refused from the next request on, on every registry replica."""
    row = _call("POST", f"/v1/tokens/{token_id}/revoke")
    out.print(f"credential {row['token_id']} ({row['name']}) revoked at {row['revoked_at'][:19]}")


def audit(
    tenant: str | None = typer.Argument(None, help="one tenant's entries (a maintainer: its own)"),
    since: str | None = typer.Option(None, "--since", help="how far back: 90m, 24h, 7d, or an ISO time"),
    limit: int = typer.Option(100, "--limit", min=1, max=1000, help="the newest N entries"),
    as_json: bool = typer.Option(False, "--json", help="the entries as JSON, one list"),
) -> None:
    """The registry's audit trail: every change of state, who made it (credential name and scope), when,
    before and after, and the request id; oldest first."""
    params: dict = {"limit": limit}
    if tenant:
        params["tenant"] = tenant
    if since:
        params["since"] = _since(since)
    rows = _call("GET", "/v1/audit", params=params)
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    table = Table("time", "who", "scope", "tenant", "action", "target", "change", "request id")
    for row in rows:
        table.add_row(
            row["at"][:19],
            row["actor"],
            row["scope"],
            row["tenant"] or "-",
            row["action"],
            row["target"],
            _change(row["before"], row["after"]),
            row["request_id"] or "-",
        )
    out.print(table)


def _since(value: str) -> str:
    if re.fullmatch(r"\d+(?:\.\d+)?[smhd]", value.strip()):
        return (datetime.now(UTC) - timedelta(seconds=_seconds(value, "--since"))).isoformat()
    try:
        return datetime.fromisoformat(value).isoformat()
    except ValueError:
        _fail(f"--since {value!r}: expected a duration such as 90m, 24h or 7d, or an ISO time")


def _change(before: dict | None, after: dict | None) -> str:
    if before is None:
        return json.dumps(after, separators=(",", ":")) if after else ""
    return f"{json.dumps(before, separators=(',', ':'))} -> {json.dumps(after, separators=(',', ':'))}"


@tenant_app.command("value-check")
def tenant_value_check(
    tenant: str = typer.Argument(...),
    min_lift: float | None = typer.Option(
        None, "--min-lift", help="pass-rate lift over the base model a new version needs, e.g. 0.2"
    ),
    no_min_lift: bool = typer.Option(False, "--no-min-lift", help="back to the gate's setting (report only)"),
    system_prompt: str | None = typer.Option(
        None, "--system-prompt", help="the base model is also scored with this system prompt"
    ),
    no_system_prompt: bool = typer.Option(False, "--no-system-prompt", help="score the base model without one"),
) -> None:
    """Show or set the tenant's value check in the eval gate (an admin, or the tenant's maintainer)."""
    body: dict = {}
    if min_lift is not None or no_min_lift:
        body["min_lift"] = None if no_min_lift else min_lift
    if system_prompt is not None or no_system_prompt:
        body["system_prompt"] = None if no_system_prompt else system_prompt
    path = f"/v1/tenants/{tenant}/value-check"
    row = _call("PATCH", path, json=body) if body else _call("GET", path)
    lift = "the gate's setting" if row["min_lift"] is None else f"{row['min_lift']:+.2f}"
    prompt = "none" if row["system_prompt"] is None else repr(row["system_prompt"])
    out.print(f"tenant {tenant}: minimum lift over the base model {lift}; base model's system prompt {prompt}")
