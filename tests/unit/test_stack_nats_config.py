"""The local stack's NATS configs: one node fsyncs before every ack; a cluster has a store dir, server
name, client/monitor/cluster port and routes per node, and clients get every node with R3."""

from __future__ import annotations

import json
from pathlib import Path

from libs.natsauth.jwt import public_key
from libs.stack.servers import NatsServer, ServerContext, nats_passwords, nats_port_names, nats_secrets

SECRETS = nats_secrets()


def _ctx(nodes: int, sync: str = "") -> ServerContext:
    ports = {name: 4000 + i for i, name in enumerate(nats_port_names(nodes))}
    return ServerContext(Path("/tmp/lpx-unit"), ports, SECRETS, "b", nats_nodes=nodes, nats_sync=sync)


def test_single_node_syncs_every_write_and_has_no_cluster():
    text = NatsServer(_ctx(1), 0).config_text()
    assert "sync_interval: always" in text and "cluster" not in text
    env = NatsServer(_ctx(1), 0).client_env()
    assert env["LPX_NATS_URL"] == "nats://127.0.0.1:4000" and env["LPX_NATS_REPLICAS"] == "1"


def test_authorization_is_on_with_every_user_and_the_callout_issuer():
    text = NatsServer(_ctx(1), 0).config_text()
    assert "auth_callout" in text and f'issuer: "{public_key(SECRETS["nats_callout_seed"])}"' in text
    for user, password in nats_passwords(SECRETS).items():
        assert f'user: "{user}", password: "{password}"' in text
    env = NatsServer(_ctx(1), 0).client_env()
    assert json.loads(env["LPX_NATS_PASSWORDS"]) == nats_passwords(SECRETS)
    assert env["LPX_REGISTRY_NATS_CALLOUT_SEED"] == SECRETS["nats_callout_seed"]


def test_three_nodes_route_to_each_other_with_their_own_names_and_stores():
    ctx = _ctx(3)
    nodes = [NatsServer(ctx, i) for i in range(3)]
    assert [n.name for n in nodes] == ["nats", "nats-2", "nats-3"]
    texts = [n.config_text() for n in nodes]
    cluster_ports = [ctx.ports[p] for p in ("nats_cluster", "nats_2_cluster", "nats_3_cluster")]
    for node, text in zip(nodes, texts, strict=True):
        assert f'server_name: "lpx-{node.name}"' in text
        assert f'store_dir: "{node.dir / "jetstream"}"' in text
        assert all(f"nats-route://127.0.0.1:{port}" in text for port in cluster_ports)
        assert "sync_interval" not in text  # R3 covers a node's crash; NATS' default interval
    assert len({n.dir for n in nodes}) == 3
    env = nodes[1].client_env()
    assert env["LPX_NATS_REPLICAS"] == "3" and env["LPX_NATS_URL"].count("nats://") == 3


def test_sync_interval_can_be_chosen():
    assert "sync_interval: 10s" in NatsServer(_ctx(3, "10s"), 0).config_text()
    assert "sync_interval" not in NatsServer(_ctx(1, "default"), 0).config_text()
