"""The Grafana dashboards against running services: every metric a panel queries (infra/grafana/dashboards)
is exported by a real loraplex process, with the labels the panel matches on, and every query returns
data from a real Prometheus scraping those processes.

All real but the engines: the session stack; the registry, a gateway, a simulated worker
(LPX_WORKER_ENGINE=sim) and a trainer as processes, each on its own metrics port; the eval gate
in-process on the simulated engine (a vLLM start would take most of this test's time) with its own
port. OpenTelemetry exports an instrument only after its first record, so traffic makes them appear:
requests over HTTP (plain, streamed, for an unknown model, over a tenant's rps limit), an async
submission over NATS, and a 2-step training job whose pushed version the eval gate evaluates (and,
with no eval cases in the dataset, rejects).

NATS panels use prometheus-nats-exporter's names (compose.yaml runs it): a Go program that is not
installable here, so they are checked against its naming rules applied to this nats-server's own
/varz and /jsz.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from libs.fleet import Fleet, FleetSpec
from libs.stack import procs
from tests.integration.registry import adapters as adapter_files
from tests.integration.registry.conftest import ADMIN, ADMIN_TOKEN, create_database
from tests.promql import (
    SYNTHETIC,
    for_prometheus,
    load_dashboards,
    matched_labels,
    metric_names,
    parse_exposition,
    queries,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
BASE = "smollm2-135m"
JOBS = ("loraplex-registry", "loraplex-gateway", "loraplex-worker", "loraplex-eval-gate", "loraplex-trainer")
NATS_BOARD = "loraplex-nats.json"
WAIT_FOR_METRICS_S = 180  # a cold trainer process: imports, loads the model, trains 2 steps, pushes

# prometheus-nats-exporter v0.20.1 (the image compose.yaml runs), collector/jsz.go: the JetStream
# metrics it makes from /jsz, by what they describe (stream series carry stream_name, consumer series
# stream_name and consumer_name).
EXPORTER_JETSTREAM = {
    "server": [
        "jetstream_server_total_streams",
        "jetstream_server_total_consumers",
        "jetstream_server_total_messages",
        "jetstream_server_total_message_bytes",
        "jetstream_server_max_memory",
        "jetstream_server_max_storage",
    ],
    "stream": [
        "jetstream_stream_total_messages",
        "jetstream_stream_total_bytes",
        "jetstream_stream_first_seq",
        "jetstream_stream_last_seq",
        "jetstream_stream_consumer_count",
        "jetstream_stream_subject_count",
        "jetstream_stream_limit_bytes",
        "jetstream_stream_limit_messages",
    ],
    "consumer": [
        "jetstream_consumer_num_pending",
        "jetstream_consumer_num_ack_pending",
        "jetstream_consumer_num_redelivered",
        "jetstream_consumer_num_waiting",
        "jetstream_consumer_delivered_consumer_seq",
        "jetstream_consumer_delivered_stream_seq",
        "jetstream_consumer_ack_floor_stream_seq",
        "jetstream_consumer_ack_floor_consumer_seq",
    ],
}


@dataclass
class Platform:
    targets: dict[str, str]  # Prometheus job -> host:port of the process' /metrics
    nats_monitor: str  # nats-server's JSON monitoring, host:port
    logs: dict[str, Path] = field(default_factory=dict)  # process -> its log, for failure messages

    def log_tails(self) -> str:
        return "\n".join(f"--- {name}:\n{path.read_text(errors='replace')[-2000:]}" for name, path in self.logs.items())

    def scrape(self, *, starting: bool = False) -> dict[str, dict[str, set[str]]]:
        """job -> sample name -> label names, as each process exports them now. `starting`: a process
        not listening yet (the trainer opens its port a moment after it was spawned) exports nothing."""
        out = {}
        for job, target in self.targets.items():
            try:
                out[job] = parse_exposition(httpx.get(f"http://{target}/metrics", timeout=5).text)
            except httpx.TransportError as exc:
                if not starting:
                    raise AssertionError(f"{job} at {target} does not answer: {exc}\n{self.log_tails()}") from None
                out[job] = {}
        return out


def dashboard_metrics(boards: dict[str, dict]) -> dict[str, set[str]]:
    """Metric name -> where it is queried, for the loraplex services' dashboards."""
    wanted: dict[str, set[str]] = {}
    for name, board in boards.items():
        if name == NATS_BOARD:
            continue
        for query in queries(name, board):
            for metric in metric_names(query.expr) - SYNTHETIC:
                wanted.setdefault(metric, set()).add(f"{name} / {query.panel}")
    return wanted


def missing(platform: Platform, wanted: dict[str, set[str]]) -> set[str]:
    exported = set().union(*(set(samples) for samples in platform.scrape(starting=True).values()))
    return set(wanted) - exported


# --- the platform ---------------------------------------------------------------------------------------
class Processes:
    """The registry and the trainer as processes (own process groups), stopped in reverse order."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.running: list[tuple[str, subprocess.Popen]] = []

    def start(self, name: str, module: str, env: dict[str, str]) -> subprocess.Popen:
        with open(self.state / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", module],
                cwd=REPO,
                env={**os.environ, **env},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.running.append((name, proc))
        return proc

    def log_tail(self, name: str) -> str:
        return (self.state / f"{name}.log").read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        for _, proc in reversed(self.running):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for _, proc in self.running:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


async def _push_active(registry: httpx.AsyncClient, tenant: str, adapter: str, path: Path) -> None:
    form = {"tenant": tenant, "adapter": adapter, "base_model": BASE}
    reply = await registry.post("/v1/adapters", data=form, files=adapter_files.files_of(path))
    assert reply.status_code == 201, reply.text
    number = reply.json()["version"]["number"]
    url = f"/v1/tenants/{tenant}/adapters/{adapter}/versions/{number}/activate"
    reply = await registry.post(url, json={"actor": "dashboards-test", "reason": "serving fixture"})
    assert reply.status_code == 200, reply.text


async def _new_tenant(registry: httpx.AsyncClient, prefix: str) -> tuple[str, str]:
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    reply = await registry.post("/v1/tenants", json={"name": name})
    assert reply.status_code == 201, reply.text
    return name, reply.json()["api_key"]


async def _traffic(gateway: str, nats_url: str, key: str, slow_key: str) -> None:
    """Requests of every kind the dashboards count."""
    from libs.client import LoraplexClient

    body = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
    async with httpx.AsyncClient(base_url=gateway, timeout=60) as http:
        auth = {"Authorization": f"Bearer {key}"}
        for alias in ("a0", "a1", "a2", "a0", "a1", "a2"):  # 3 adapters on 2 slots: tier misses and evictions
            reply = await http.post("/v1/chat/completions", json={**body, "model": alias}, headers=auth)
            assert reply.status_code == 200, reply.text
        streamed = await http.post("/v1/chat/completions", json={**body, "model": "a0", "stream": True}, headers=auth)
        assert streamed.status_code == 200 and "[DONE]" in streamed.text
        unknown = await http.post("/v1/chat/completions", json={**body, "model": "nope"}, headers=auth)
        assert unknown.status_code == 404  # an error, per tenant
        slow = {"Authorization": f"Bearer {slow_key}"}
        statuses = [
            (await http.post("/v1/chat/completions", json={**body, "model": "a0"}, headers=slow)).status_code
            for _ in range(4)
        ]
        assert 429 in statuses, statuses  # over its 1 request/s
    async with LoraplexClient(nats_url) as client:
        rid = await client.submit("a0", messages=body["messages"], max_tokens=4, api_key=key, timeout_s=60)
        assert (await client.result(rid, timeout=60)).ok


async def _train(registry: httpx.AsyncClient, nats_url: str, tenant: str) -> None:
    """A 2-step training job on a train-only dataset: the trainer pushes a version, the gate rejects it."""
    import nats

    from libs.contracts import DatasetRef, TrainJob, subjects
    from tests.adapters import TONES, tone_examples

    lines = "".join(json.dumps(example) + "\n" for example in tone_examples(TONES["pirate"])).encode()
    reply = await registry.post(
        "/v1/datasets", data={"tenant": tenant, "name": "chats"}, files={"file": ("chats.jsonl", lines)}
    )
    assert reply.status_code == 201, reply.text
    row = (await registry.get(f"/v1/tenants/{tenant}/datasets")).json()[0]
    job = TrainJob(
        tenant=tenant,
        adapter="trained",
        base_model=BASE,
        steps=2,
        batch_size=1,
        seed=0,
        dataset=DatasetRef(**{k: row[k] for k in ("name", "digest", "object_key")}),
    )
    nc = await nats.connect(nats_url)
    try:
        await nc.jetstream().publish(
            subjects.TRAIN_JOBS,
            job.model_dump_json().encode(),
            stream=subjects.TRAIN_STREAM,
            headers={"Nats-Msg-Id": job.job_id},
        )
    finally:
        await nc.drain()


@pytest.fixture(scope="module")
async def platform(stack, connections, base_model_path, tmp_path_factory):
    from libs.engine import EngineConfig, create_engine
    from services.eval_gate.app import EvalGate
    from services.eval_gate.settings import EvalGateSettings
    from tests.adapters import tiny_adapters

    state = tmp_path_factory.mktemp("dashboards")
    ports = dict(zip(JOBS, procs.free_ports(len(JOBS)), strict=True))
    registry_port = procs.free_port()
    # Every service's metrics on loopback only (each reads its own LPX_<SERVICE>_METRICS_HOST).
    loopback = {
        "LPX_ENV_FILE": str(stack.env_file),
        **{f"LPX_{svc}_METRICS_HOST": "127.0.0.1" for svc in ("REGISTRY", "GATEWAY", "WORKER", "TRAINER")},
    }
    processes = Processes(state)
    fleet = Fleet(
        env_file=stack.env_file,
        state=state / "fleet",
        spec=FleetSpec(pool="dash-smollm2-r16", max_loras=2, max_cpu_loras=2),
    )
    gate = engine = None
    try:
        suffix = uuid.uuid4().hex[:8]
        processes.start(
            "registry",
            "services.registry",
            {
                **loopback,
                "LPX_PG_DSN": await create_database(connections),
                "LPX_REGISTRY_PORT": str(registry_port),
                "LPX_REGISTRY_ADMIN_TOKEN": ADMIN_TOKEN,
                "LPX_REGISTRY_METRICS_PORT": str(ports["loraplex-registry"]),
                "LPX_REGISTRY_EVAL_DURABLE": f"dash-{suffix}",
                "LPX_REGISTRY_EVAL_DELIVER_POLICY": "new",
                "LPX_REGISTRY_USAGE_DURABLE": f"dash-usage-{suffix}",
                "LPX_REGISTRY_USAGE_DELIVER_POLICY": "new",
                "LPX_REGISTRY_OUTBOX_POLL_S": "0.2",
            },
        )
        gateway = fleet.start_gateway(
            "dash-gw", {**loopback, "LPX_GATEWAY_METRICS_PORT": str(ports["loraplex-gateway"])}
        )
        fleet.start_worker("dash-sim", {**loopback, "LPX_WORKER_METRICS_PORT": str(ports["loraplex-worker"])})
        registry_url = f"http://127.0.0.1:{registry_port}"
        assert procs.wait_until(lambda: _ready(f"{registry_url}/readyz"), 90), processes.log_tail("registry")

        async with httpx.AsyncClient(base_url=registry_url, headers=ADMIN, timeout=60) as registry:
            tenant, key = await _new_tenant(registry, "dash")
            slow, slow_key = await _new_tenant(registry, "dash-slow")
            paths = await asyncio.to_thread(tiny_adapters, base_model_path, 4)
            for i, path in enumerate(paths[:3]):
                await _push_active(registry, tenant, f"a{i}", path)
            await _push_active(registry, slow, "a0", paths[3])
            reply = await registry.put(f"/v1/tenants/{slow}/limits", json={"rps": 1})
            assert reply.status_code == 200, reply.text

            # The gate starts after the serving adapters were activated by hand (deliver_policy "new"),
            # so that it evaluates only the trained version.
            await asyncio.sleep(1.0)
            engine = create_engine(
                EngineConfig(
                    model_path=base_model_path, engine="sim", served_model_name=BASE, max_loras=2, max_cpu_loras=4
                )
            )
            gate_settings = EvalGateSettings(
                connections=connections,
                base_model=BASE,
                model_path=base_model_path,
                durable=f"dash-gate-{suffix}",
                deliver_policy="new",
                work_dir=state / "gate",
                metrics_port=ports["loraplex-eval-gate"],
                metrics_host="127.0.0.1",
            )
            gate = EvalGate(gate_settings, engine=engine)
            await gate.start()
            processes.start(
                "trainer",
                "services.trainer",
                {
                    **loopback,
                    "LPX_TRAINER_TRAINER_ID": f"dash-{suffix}",
                    "LPX_TRAINER_REGISTRY_URL": registry_url,
                    "LPX_TRAINER_ADMIN_TOKEN": ADMIN_TOKEN,
                    "LPX_TRAINER_MODELS_ROOT": str(base_model_path.parent),
                    "LPX_TRAINER_WORK_DIR": str(state / "trainer"),
                    "LPX_TRAINER_DEVICE": "cpu",
                    "LPX_TRAINER_MAX_LENGTH": "64",
                    "LPX_TRAINER_METRICS_PORT": str(ports["loraplex-trainer"]),
                },
            )
            await _train(registry, connections.nats_url, tenant)

            await fleet.wait_ready(1)
            await _traffic(gateway, connections.nats_url, key, slow_key)

        nats_server = next(server for server in stack.servers() if server.name == "nats")
        made = Platform(
            {job: f"127.0.0.1:{port}" for job, port in ports.items()},
            f"127.0.0.1:{nats_server.ctx.ports['nats_monitor']}",
            {name: state / f"{name}.log" for name in ("registry", "trainer", "fleet/dash-gw", "fleet/dash-sim")},
        )
        # Until every metric a dashboard queries is there (the trainer and the gate take longest).
        wanted = dashboard_metrics(load_dashboards())
        deadline = time.monotonic() + WAIT_FOR_METRICS_S
        while missing(made, wanted) and time.monotonic() < deadline:
            await asyncio.sleep(1.0)
        yield made
    finally:
        if gate is not None:
            await gate.stop()
            await gate.close()
        if engine is not None:
            await engine.shutdown()
        fleet.stop()
        processes.stop()


def _ready(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


# --- the checks -----------------------------------------------------------------------------------------
def test_every_metric_a_dashboard_queries_is_exported(platform):
    wanted = dashboard_metrics(load_dashboards())
    absent = {metric: sorted(wanted[metric]) for metric in sorted(missing(platform, wanted))}
    assert not absent, f"queried but not exported: {json.dumps(absent, indent=1)}\n{platform.log_tails()}"


def test_label_matchers_name_labels_the_metric_has(platform):
    exported: dict[str, set[str]] = {}
    for samples in platform.scrape().values():
        for name, labels in samples.items():
            exported.setdefault(name, set()).update(labels)
    for name, board in load_dashboards().items():
        if name == NATS_BOARD:
            continue
        for query in queries(name, board):
            for metric, labels in matched_labels(query.expr).items():
                if metric in SYNTHETIC:
                    continue
                assert labels <= exported[metric], (
                    f"{name} / {query.panel}: {metric} has no {labels - exported[metric]}"
                )


def test_nats_panels_use_names_the_exporter_makes_from_this_server(platform):
    """gnatsd_varz_<field>: every number of /varz, nested objects joined with "_" (the exporter's
    collector.go); jetstream_*: the exporter's fixed names, with streams and consumers to describe."""
    varz = httpx.get(f"http://{platform.nats_monitor}/varz", timeout=5).json()
    # What the exporter asks for with -jsz=all.
    jsz = httpx.get(f"http://{platform.nats_monitor}/jsz?consumers=true&config=true&raft=true", timeout=5).json()
    from_varz = {f"gnatsd_varz_{path}" for path in _numbers(varz)}
    streams = [stream for account in jsz.get("account_details", []) for stream in account.get("stream_detail", [])]
    consumers = [consumer for stream in streams for consumer in stream.get("consumer_detail", [])]
    assert streams and consumers, "the exporter would have no stream or consumer series to show"
    jetstream = set().union(*EXPORTER_JETSTREAM.values())
    board = load_dashboards()[NATS_BOARD]
    for query in queries(NATS_BOARD, board):
        for metric in metric_names(query.expr) - SYNTHETIC:
            assert metric in from_varz | jetstream, f"{query.panel}: the exporter makes no {metric}"


def _numbers(obj: dict, prefix: str = "") -> set[str]:
    found = set()
    for key, value in obj.items():
        path = f"{prefix}_{key}" if prefix else key
        if isinstance(value, dict):
            found |= _numbers(value, path)
        elif isinstance(value, int | float) and not isinstance(value, bool):
            found.add(path)
    return found


def test_every_query_returns_data_from_a_real_prometheus(platform, tmp_path):
    """Prometheus scrapes the same processes under the job names of infra/prometheus/prometheus.yml and
    evaluates each panel's query (Grafana's variables expanded): it parses, joins without a
    many-to-many error, and has a result. NATS' queries only have to parse: no exporter runs here."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("the prometheus server is not installed (Debian package prometheus)")
    jobs = [{"job_name": job, "static_configs": [{"targets": [target]}]} for job, target in platform.targets.items()]
    config = tmp_path / "prometheus.yml"
    config.write_text(json.dumps({"global": {"scrape_interval": "1s"}, "scrape_configs": jobs}))
    port = procs.free_port()
    with open(tmp_path / "prometheus.log", "wb") as log:
        server = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    api = f"http://127.0.0.1:{port}/api/v1"
    try:
        assert procs.wait_until(lambda: _ready(f"http://127.0.0.1:{port}/-/ready"), 60), "prometheus did not start"

        def scraped() -> bool:  # rate() needs two samples of every target in its window: wait for three
            result = httpx.get(f"{api}/query", params={"query": "count_over_time(up[1m])"}).json()["data"]["result"]
            return len(result) == len(jobs) and all(float(r["value"][1]) >= 3 for r in result)

        assert procs.wait_until(scraped, 60), (tmp_path / "prometheus.log").read_text()[-2000:]
        empty = []
        for name, board in load_dashboards().items():
            for query in queries(name, board):
                if query.panel.startswith("variable "):
                    continue
                reply = httpx.get(f"{api}/query", params={"query": for_prometheus(query.expr)}).json()
                assert reply["status"] == "success", f"{name} / {query.panel}: {reply.get('error')}: {query.expr}"
                if name != NATS_BOARD and not reply["data"]["result"]:
                    empty.append(f"{name} / {query.panel}: {query.expr}")
        assert not empty, "queries without data:\n" + "\n".join(empty)
        down = httpx.get(f"{api}/query", params={"query": "up == 0"}).json()["data"]["result"]
        assert not down, down
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(30)
