"""`lpx nats ...`: the broker's authorization, for deployments that run their own nats-server (compose,
Kubernetes). The local stack (`lpx stack up`, `lpx up`) writes its own config and needs none of this."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.table import Table

nats_app = typer.Typer(
    help="NATS authorization: the server config block, credentials, permissions.", no_args_is_help=True
)
out = Console()


def register(app: typer.Typer) -> None:
    app.add_typer(nats_app, name="nats")


@nats_app.command("config")
def nats_config() -> None:
    """Print the accounts/authorization block of nats-server's config (infra/nats/auth.conf is this
    output). Passwords and the callout issuer are `$LPX_NATS_PASSWORD_<USER>` / `$LPX_NATS_CALLOUT_ISSUER`
    references that nats-server reads from its environment: see `lpx nats secrets`."""
    from libs.natsauth import server_config

    typer.echo(server_config.render(), nl=False)


def env_password(random_part: str) -> str:
    """A password nats-server can read from a `$VAR` reference. It parses the value as a config token:
    one that starts with `-`, or with digits then `-` or `.`, reads as a number or date and stops the
    server ("Expected a digit but got ..."). A compose-check failed on a token_urlsafe password starting
    with `-`. These start with letters and hold only hex digits after."""
    return "lpx" + random_part


@nats_app.command("secrets")
def nats_secrets() -> None:
    """Print fresh credentials as env lines (a compose `.env`, or the data of a Kubernetes Secret): a
    password per NATS user, the auth callout's signing seed (the registry's only) and its public key
    (the server's `issuer`). Store them as secrets; never commit them."""
    import secrets

    from libs.natsauth import permissions
    from libs.natsauth.jwt import new_account_seed, public_key

    for role in permissions.ROLES:
        typer.echo(f"{role.env_var}={env_password(secrets.token_hex(24))}")
    seed = new_account_seed()
    typer.echo(f"LPX_REGISTRY_NATS_CALLOUT_SEED={seed}")
    typer.echo(f"LPX_NATS_CALLOUT_ISSUER={public_key(seed)}")


@nats_app.command("permissions")
def nats_permissions(
    tenant: str = typer.Option("TENANT", help="show a tenant connection's for this name"),
    markdown: bool = typer.Option(False, "--markdown", help="the README's table"),
) -> None:
    """What each NATS user may publish and subscribe to (libs/natsauth/permissions.py)."""
    from libs.natsauth import permissions

    if markdown:
        typer.echo(permissions.markdown_table(), nl=False)
        return

    table = Table("user", "account", "for", "publish", "subscribe", show_lines=True)
    for role in permissions.ROLES:
        table.add_row(
            role.user, role.account, role.doc, "\n".join(role.publish_allow()), "\n".join(role.subscribe_allow())
        )
    allowed = permissions.tenant_permissions(tenant)
    table.add_row(
        f"tenant:{tenant}",
        permissions.ACCOUNT,
        "a tenant's async client (auth callout)",
        "\n".join(allowed.publish),
        "\n".join(allowed.subscribe),
    )
    out.print(table)
