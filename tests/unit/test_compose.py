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
    assert compose["services"]["nats"]["command"][0] == "-c"
    for conf in ("single", "cluster-1", "cluster-2", "cluster-3"):
        assert "jetstream {" in (ROOT / "infra" / "nats" / f"{conf}.conf").read_text()
    assert "sync_interval: always" in (ROOT / "infra" / "nats" / "single.conf").read_text()


def test_cluster_profile_has_three_nodes_routing_to_each_other(compose):
    services = compose["services"]
    assert services["nats-2"]["profiles"] == ["cluster"] == services["nats-3"]["profiles"]
    for i in (1, 2, 3):
        text = (ROOT / "infra" / "nats" / f"cluster-{i}.conf").read_text()
        assert f"server_name: lpx-nats-{i}" in text
        assert all(f"nats-route://{host}:6222" in text for host in ("nats", "nats-2", "nats-3"))


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
        assert env["LPX_NATS_URL"] == "${LPX_NATS_URL:-nats://nats:4222}"  # the cluster profile lists all three
        assert env["LPX_NATS_REPLICAS"] == "${LPX_NATS_REPLICAS:-1}"
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


# --- observability: Prometheus, the NATS exporter, Grafana -------------------------------------------
def _prometheus_config() -> dict:
    return yaml.safe_load((ROOT / "infra/prometheus/prometheus.yml").read_text())


def test_prometheus_scrapes_every_service_on_the_port_it_exports(compose):
    jobs = {job["job_name"]: job for job in _prometheus_config()["scrape_configs"]}
    for name in APP:
        env = compose["services"][name]["environment"]
        port = env[f"LPX_{name.upper().replace('-', '_')}_METRICS_PORT"]  # 0 or unset: nothing to scrape
        (discovery,) = jobs[f"loraplex-{name}"]["dns_sd_configs"]
        assert discovery["names"] == [name] and str(discovery["port"]) == port, name
    # NATS through the exporter, which reads the server's JSON monitoring port.
    exporter = compose["services"]["nats-exporter"]
    assert exporter["command"][-1] == "http://nats:8222" and "-jsz=all" in exporter["command"]
    assert "http: 0.0.0.0:8222" in (ROOT / "infra/nats/single.conf").read_text()
    assert jobs["nats"]["static_configs"] == [{"targets": ["nats-exporter:7777"]}]  # the exporter's default port


def test_prometheus_and_grafana_are_wired_to_their_config(compose):
    services = compose["services"]
    assert "./infra/prometheus/prometheus.yml:/etc/prometheus/prometheus.yml:ro" in services["prometheus"]["volumes"]
    assert "--config.file=/etc/prometheus/prometheus.yml" in services["prometheus"]["command"]
    grafana = services["grafana"]
    assert "./infra/grafana/provisioning:/etc/grafana/provisioning:ro" in grafana["volumes"]
    assert "./infra/grafana/dashboards:/etc/loraplex/dashboards:ro" in grafana["volumes"]
    assert grafana["depends_on"]["prometheus"]["condition"] == "service_healthy"
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert (ROOT / "infra/grafana/dashboards" / home.removeprefix("/etc/loraplex/dashboards/")).is_file()
    for name in ("prometheus", "grafana"):  # not open beyond the host
        assert all(port.startswith("127.0.0.1:") for port in services[name]["ports"]), name

    provisioning = ROOT / "infra/grafana/provisioning"
    (source,) = yaml.safe_load((provisioning / "datasources/prometheus.yaml").read_text())["datasources"]
    assert source["uid"] == "prometheus" and source["url"] == "http://prometheus:9090"  # what dashboards name
    (provider,) = yaml.safe_load((provisioning / "dashboards/loraplex.yaml").read_text())["providers"]
    assert provider["options"]["path"] == "/etc/loraplex/dashboards"


def test_prometheus_config_is_valid_for_promtool():
    import shutil
    import subprocess

    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package prometheus)")
    checked = subprocess.run(
        [promtool, "check", "config", str(ROOT / "infra/prometheus/prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
