"""What the local stack is told (`LPX_STACK_*`) and what it keeps: `stack.json` (ports, generated
credentials, pids, data dirs) and `stack.env` (what clients read)."""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from libs.paths import stack_dir
from libs.stack import procs
from libs.stack.servers import nats_secrets, port_names, postgres_dir


class StackConfig(BaseSettings):
    """`LPX_STACK_*` settings. Ports default to free ones, chosen once and kept in stack.json."""

    model_config = SettingsConfigDict(env_prefix="LPX_STACK_", extra="ignore")

    dir: Path = Field(default_factory=stack_dir)
    nats_port: int = 0
    nats_monitor_port: int = 0
    postgres_port: int = 0
    s3_port: int = 0
    bucket: str = "loraplex-adapters"
    start_timeout_s: float = 60.0
    # 1: one nats-server; 3: a JetStream cluster on loopback (streams and buckets R3).
    nats_nodes: int = Field(1, ge=1, le=5)
    # JetStream sync_interval ("always", "default" or a duration like "10s"); "" = always on one node,
    # the NATS default on a cluster (R3 covers a node's crash there).
    nats_sync: str = ""

    def requested_ports(self) -> dict[str, int]:
        wanted = {
            "nats": self.nats_port,
            "nats_monitor": self.nats_monitor_port,
            "postgres": self.postgres_port,
            "s3": self.s3_port,
        }
        return {name: port for name, port in wanted.items() if port}


@dataclass
class ServerStatus:
    name: str
    pid: int | None
    running: bool
    healthy: bool
    endpoint: str
    log: Path


@dataclass
class StackState:
    ports: dict[str, int]
    secrets: dict[str, str]
    bucket: str
    pids: dict[str, int] = field(default_factory=dict)
    dirs: dict[str, str] = field(default_factory=dict)
    nats_nodes: int = 1
    nats_sync: str = ""

    @classmethod
    def fresh(cls, config: StackConfig) -> StackState:
        names = [n for group in port_names(config.nats_nodes).values() for n in group]
        ports = dict(zip(names, procs.free_ports(len(names)), strict=True))
        ports.update(config.requested_ports())
        creds = {
            "pg_password": secrets.token_urlsafe(18),
            "s3_access_key": "lpx" + secrets.token_hex(8),
            "s3_secret_key": secrets.token_urlsafe(24),
            **nats_secrets(),
        }
        dirs = {"postgres": str(postgres_dir(config.dir.expanduser().resolve(), secrets.token_hex(6)))}
        return cls(
            ports=ports,
            secrets=creds,
            bucket=config.bucket,
            dirs=dirs,
            nats_nodes=config.nats_nodes,
            nats_sync=config.nats_sync,
        )

    @classmethod
    def load(cls, path: Path) -> StackState | None:
        if not path.exists():
            return None
        state = cls(**json.loads(path.read_text()))
        # A stack made before NATS authorization: its users get passwords now (kept from here on).
        state.secrets = {**nats_secrets(), **state.secrets}
        return state

    def save(self, path: Path) -> None:
        _write_private(path, json.dumps(self.__dict__, indent=2))


def write_env(path: Path, env: dict[str, str]) -> None:
    body = "# written by `lpx stack up`; removed by `lpx stack down`\n"
    body += "".join(f"{key}={value}\n" for key, value in env.items())
    _write_private(path, body)


def _write_private(path: Path, text: str) -> None:
    """Replace `path` at once with `text`, readable by its owner only (it holds credentials)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.chmod(tmp, 0o600)
    tmp.replace(path)
