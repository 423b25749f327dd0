"""compose.yaml cannot be run here (no Docker engine), so check its structure instead."""

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
INFRA = {"nats", "postgres", "minio"}
APP = {"gateway", "registry", "eval-gate", "trainer", "worker"}


@pytest.fixture(scope="module")
def compose():
    return yaml.safe_load((ROOT / "compose.yaml").read_text())


def test_every_service_is_defined(compose):
    assert INFRA | APP | {"minio-init"} <= set(compose["services"])


def test_infra_has_healthchecks(compose):
    for name in INFRA:
        check = compose["services"][name]["healthcheck"]["test"]
        assert check and check[0] in ("CMD", "CMD-SHELL"), name
    assert "-js" in compose["services"]["nats"]["command"]


def test_app_services_wait_for_healthy_dependencies(compose):
    services = compose["services"]
    for name in APP:
        deps = services[name]["depends_on"]
        for dep, cond in deps.items():
            assert dep in services, f"{name} depends on undefined {dep}"
            assert cond["condition"] in ("service_healthy", "service_completed_successfully")
            if cond["condition"] == "service_healthy":
                assert "healthcheck" in services[dep], f"{name} waits for {dep}, which has no healthcheck"
        assert {"nats", "postgres", "minio-init"} <= set(deps), name


def test_app_services_are_configured_by_env_only(compose):
    for name in APP:
        env = compose["services"][name]["environment"]
        assert env["LPX_NATS_URL"].startswith("nats://nats:")
        assert env["LPX_S3_ENDPOINT"] == "minio:9000"
        assert "postgres:5432" in env["LPX_PG_DSN"]


def test_worker_reserves_a_gpu(compose):
    devices = compose["services"]["worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert any("gpu" in d["capabilities"] for d in devices)


def test_every_build_target_exists_in_the_dockerfile(compose):
    dockerfile = (ROOT / "infra/docker/Dockerfile").read_text()
    targets = set(re.findall(r"^FROM \S+ AS (\S+)$", dockerfile, flags=re.M))
    for name in APP:
        build = compose["services"][name]["build"]
        assert build["dockerfile"] == "infra/docker/Dockerfile"
        assert build["target"] in targets, name
