"""PostgreSQL: initdb on first start, the server as a plain process (as `postgres` when we are root),
the platform's role and database once it is up."""

from __future__ import annotations

import glob
import hashlib
import os
import pwd
import shutil
import signal
import subprocess
from pathlib import Path

from libs.stack.server import Server, ServerContext, StackError


def find_pg_bindir() -> Path:
    explicit = os.environ.get("LPX_STACK_PG_BIN")
    candidates = [Path(explicit)] if explicit else []
    candidates += [Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_pg_version, reverse=True)]
    on_path = shutil.which("postgres")
    if on_path:
        candidates.append(Path(on_path).parent)
    for cand in candidates:
        if (cand / "postgres").exists() and (cand / "initdb").exists():
            return cand
    raise StackError(
        "PostgreSQL server binaries (postgres, initdb) not found. Install the Debian package "
        "'postgresql' (apt-get install -y postgresql) or set LPX_STACK_PG_BIN to their directory."
    )


def _pg_version(path: str) -> int:
    try:
        return int(Path(path).parent.name.split(".")[0])
    except ValueError:
        return 0


class PostgresServer(Server):
    name = "postgres"
    stop_signal = signal.SIGINT  # "fast" shutdown: don't wait for clients to disconnect
    user = "loraplex"
    database = "loraplex"

    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        self.bindir = find_pg_bindir()
        self.data = self.dir / "data"
        self.sockets = self.dir / "run"

    def run_as(self) -> str | None:
        # PostgreSQL refuses to run as root; run it as the distribution's `postgres` user.
        return "postgres" if os.geteuid() == 0 else None

    def prepare(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.sockets.mkdir(exist_ok=True)
        owner = self.run_as()
        if owner:
            _check_reachable_by(self.dir, owner)
            for path in (self.dir, self.sockets):
                shutil.chown(path, owner, owner)
        if not (self.data / "PG_VERSION").exists():
            self._initdb(owner)

    def _initdb(self, owner: str | None) -> None:
        shutil.rmtree(self.data, ignore_errors=True)
        pwfile = self.dir / ".pwfile"
        pwfile.write_text(self.ctx.secrets["pg_password"] + "\n")
        os.chmod(pwfile, 0o600)
        if owner:
            shutil.chown(pwfile, owner, owner)
        cmd = [
            str(self.bindir / "initdb"),
            "-D",
            str(self.data),
            "-U",
            self.user,
            f"--pwfile={pwfile}",
            "--auth-host=scram-sha-256",
            "--auth-local=trust",
            "-E",
            "UTF8",
            "--no-instructions",
        ]
        try:
            subprocess.run(cmd, check=True, capture_output=True, text=True, user=owner)
        except subprocess.CalledProcessError as exc:
            raise StackError(f"initdb failed: {exc.stderr.strip() or exc.stdout.strip()}") from exc
        finally:
            pwfile.unlink(missing_ok=True)

    def command(self) -> list[str]:
        return [
            str(self.bindir / "postgres"),
            "-D",
            str(self.data),
            "-p",
            str(self.ctx.ports["postgres"]),
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            f"unix_socket_directories={self.sockets}",
            "-c",
            "max_connections=200",
            "-c",
            "fsync=off" if os.environ.get("LPX_STACK_PG_FSYNC", "on") == "off" else "fsync=on",
        ]

    def healthy(self) -> bool:
        cmd = [str(self.bindir / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(self.ctx.ports["postgres"])]
        return subprocess.run(cmd, capture_output=True).returncode == 0

    def after_healthy(self) -> None:
        sql = f"SELECT 1 FROM pg_database WHERE datname = '{self.database}'"
        if self._psql("postgres", sql).strip() != "1":
            self._psql("postgres", f'CREATE DATABASE "{self.database}" OWNER "{self.user}"')

    def _psql(self, db: str, sql: str) -> str:
        cmd = [str(self.bindir.parent / "bin" / "psql")]
        if not Path(cmd[0]).exists():
            cmd = [shutil.which("psql") or "psql"]
        cmd += [
            "-X",
            "-qAt",
            "-h",
            "127.0.0.1",
            "-p",
            str(self.ctx.ports["postgres"]),
            "-U",
            self.user,
            "-d",
            db,
            "-c",
            sql,
        ]
        env = {**os.environ, "PGPASSWORD": self.ctx.secrets["pg_password"]}
        done = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if done.returncode != 0:
            raise StackError(f"psql failed: {done.stderr.strip()}")
        return done.stdout

    def endpoint(self) -> str:
        pw = self.ctx.secrets["pg_password"]
        return f"postgresql+asyncpg://{self.user}:{pw}@127.0.0.1:{self.ctx.ports['postgres']}/{self.database}"

    def client_env(self) -> dict[str, str]:
        return {"LPX_PG_DSN": self.endpoint()}


def postgres_dir(state_dir: Path, stack_id: str) -> Path:
    """Where PostgreSQL keeps its data: inside the state dir when the server's user can reach it.

    As root, PostgreSQL runs as `postgres`, which cannot enter e.g. a checkout under /root (mode 700).
    Then its data goes to a directory under /var/tmp named after the state dir and the stack's own
    random id; stack.json records it, `down` leaves it like the rest of the data, and `down --purge`
    deletes it. The id matters: a state dir deleted without `--purge` leaves its data behind, and a
    new stack at the same path must not pick up that cluster, whose password it does not know.
    """
    default = state_dir / "postgres"
    if os.geteuid() != 0 or _blocked_ancestor(default, "postgres") is None:
        return default
    tag = hashlib.sha256(f"{state_dir}:{stack_id}".encode()).hexdigest()[:12]
    return Path("/var/tmp") / f"loraplex-stack-{tag}" / "postgres"


def _blocked_ancestor(path: Path, user: str) -> Path | None:
    uid = pwd.getpwnam(user).pw_uid
    for parent in [path, *path.parents]:
        if not parent.exists():
            continue
        st = parent.stat()
        if st.st_uid != uid and not st.st_mode & 0o001:
            return parent
    return None


def _check_reachable_by(path: Path, user: str) -> None:
    """Every ancestor must be traversable by `user`, or PostgreSQL cannot open its data dir."""
    blocked = _blocked_ancestor(path, user)
    if blocked is not None:
        raise StackError(
            f"PostgreSQL runs as '{user}', which cannot traverse {blocked}; "
            f"point LPX_STACK_DIR at a directory it can reach"
        )
