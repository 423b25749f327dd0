"""`lpx tenant|adapter|base ...`: the registry's admin CLI, a thin client of its HTTP API.

The registry is found at LPX_REGISTRY_URL (default http://127.0.0.1:8100) and calls carry
LPX_REGISTRY_TOKEN (a registry credential from `lpx tenant token create`: an admin's, or a tenant
maintainer's) or else LPX_REGISTRY_ADMIN_TOKEN (the bootstrap admin token); they may also come from the
stack env file. Refusals print the registry's
own reason and exit with status 1.
"""

from __future__ import annotations

import typer
from pydantic import SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict
from rich.console import Console

from libs.paths import lpx_home, platform_env_file, stack_env_file

UPLOAD_CHUNK = 1 << 16
err = Console(stderr=True)
out = Console()

tenant_app = typer.Typer(help="Tenants and their API keys.", no_args_is_help=True)
adapter_app = typer.Typer(help="Adapters: push versions, list, show, history, rollback.", no_args_is_help=True)
base_app = typer.Typer(help="Base models known to the registry.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    """The groups; their commands attach on import (tenant_cmds, adapter_cmds: libs/cli/main.py imports them)."""
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
