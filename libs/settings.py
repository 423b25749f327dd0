"""Settings shared by every service: connection endpoints plus a base class for per-service settings.

Precedence (highest first): real environment variables, the stack env file (`lpx stack up` writes it),
field defaults. Each service declares one subclass of `ServiceSettings` with its own env prefix,
e.g. `LPX_GATEWAY_`; connection endpoints are common to all and use the plain `LPX_` prefix.
"""

from __future__ import annotations

from pathlib import Path
from typing import Self

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from libs.paths import stack_env_file


class ConnectionSettings(BaseSettings):
    """Where the platform's servers are: NATS, PostgreSQL, the S3 store."""

    model_config = SettingsConfigDict(env_prefix="LPX_", extra="ignore")

    # One URL, or every node of a cluster separated by commas (clients fail over between them).
    nats_url: str = "nats://127.0.0.1:4222"
    # Replicas of every stream and KV bucket: 1 on a single node, 3 on a 3-node cluster (R3: an
    # acknowledged message survives the loss of any one node).
    nats_replicas: int = Field(1, ge=1, le=5)
    # NATS credentials. A deployed process gets its own service user (LPX_NATS_USER/LPX_NATS_PASSWORD);
    # the local stack's env file lists the password of every service user instead (LPX_NATS_PASSWORDS,
    # JSON {user: password}), and each process picks its own role's (see `nats_auth`).
    nats_user: str | None = None
    nats_password: str | None = Field(None, repr=False)
    nats_passwords: dict[str, str] = Field(default_factory=dict, repr=False)
    # A broker that lets anyone connect without credentials is refused at start unless this is set
    # (a test's private nats-server; never in production: see README "NATS authorization").
    nats_allow_open: bool = False
    pg_dsn: str = "postgresql+asyncpg://loraplex:loraplex@127.0.0.1:5432/loraplex"
    s3_endpoint: str = "127.0.0.1:9000"
    s3_access_key: str = "loraplex"
    s3_secret_key: str = "loraplex-secret"
    s3_bucket: str = "loraplex-adapters"
    s3_secure: bool = False
    s3_region: str = "us-east-1"

    @property
    def nats_servers(self) -> list[str]:
        return nats_servers(self.nats_url)

    def nats_auth(self, role: str) -> dict[str, str]:
        """nats-py connect options for a process acting as `role` (a service user: gateway, worker,
        registry, eval-gate, trainer; admin for operator tools; the registry's callout and system
        users): that role's password from LPX_NATS_PASSWORDS, else the process's own LPX_NATS_USER (never
        for the callout and system users, which only the map names); none on an open broker."""
        if role in self.nats_passwords:
            return {"user": role, "password": self.nats_passwords[role]}
        if self.nats_user and role not in ("callout", "system"):
            return {"user": self.nats_user, "password": self.nats_password or ""}
        return {}

    @classmethod
    def load(cls, env_file: Path | None = None) -> Self:
        return cls(_env_file=_existing(env_file or stack_env_file()))


class ServiceSettings(BaseSettings):
    """Base for one service's settings. Subclasses set `model_config` with their own env prefix."""

    model_config = SettingsConfigDict(env_prefix="LPX_SERVICE_", extra="ignore")

    log_level: str = "INFO"
    log_format: str = Field("console", description="console (human) or json (one object per line)")
    # Prometheus scrape port for this process; 0 disables the exporter.
    metrics_port: int = 0
    # The address it listens on: every interface in a pod; `lpx up` keeps it on 127.0.0.1.
    metrics_host: str = "0.0.0.0"
    connections: ConnectionSettings = Field(default_factory=ConnectionSettings)

    @classmethod
    def load(cls, env_file: Path | None = None, **overrides) -> Self:
        path = _existing(env_file or stack_env_file())
        overrides.setdefault("connections", ConnectionSettings(_env_file=path))
        return cls(_env_file=path, **overrides)


def nats_servers(nats_url: str) -> list[str]:
    """The node URLs of an `LPX_NATS_URL` (one URL, or a cluster's, comma-separated)."""
    return [url.strip() for url in nats_url.split(",") if url.strip()]


def _existing(path: Path) -> Path | None:
    return path if path.is_file() else None
