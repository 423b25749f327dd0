"""The three servers of the local stack (NATS JetStream, PostgreSQL, an S3 store), one module each:
libs/stack/server.py (what a server is), nats_server.py, postgres_server.py, s3_server.py. Their names
are importable from here as before."""

from __future__ import annotations

from libs.stack.nats_server import (
    NatsServer,
    _node_port_prefix,
    admin_auth,
    nats_node_name,
    nats_passwords,
    nats_port_names,
    nats_secrets,
)
from libs.stack.postgres_server import PostgresServer, find_pg_bindir, postgres_dir
from libs.stack.s3_server import S3Server
from libs.stack.server import Server, ServerContext, StackError, _venv_binary

__all__ = [
    "PORT_NAMES",
    "SERVER_CLASSES",
    "NatsServer",
    "PostgresServer",
    "S3Server",
    "Server",
    "ServerContext",
    "StackError",
    "_node_port_prefix",
    "_venv_binary",
    "admin_auth",
    "find_pg_bindir",
    "nats_node_name",
    "nats_passwords",
    "nats_port_names",
    "nats_secrets",
    "port_names",
    "postgres_dir",
]


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
