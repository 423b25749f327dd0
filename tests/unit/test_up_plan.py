"""How `lpx up` lays the platform out: dependency order, names, settings each service reads, worker
counts that fit the machine (and a clear refusal when they do not), and the crash-loop backoff."""

from __future__ import annotations

import json
import socket

import pytest

from libs.up import plan
from libs.up.plan import PlanError
from libs.up.runner import backoff_s
from libs.up.settings import UpSettings


def build(tmp_path, bases=("smollm2-135m",), workers=2):
    return plan.build(
        bases=list(bases),
        workers=workers,
        registry_port=8100,
        gateway_port=8000,
        admin_token="tok",
        env_file=tmp_path / "stack.env",
        state=tmp_path,
        gateway_metrics_port=9464,
    )


def test_services_start_in_dependency_order(tmp_path):
    specs = build(tmp_path, bases=("smollm2-135m", "llama-3.1-8b"))
    names = [s.name for s in specs]
    assert names[0] == "registry" and names[-1] == "gateway"
    assert [s.stage for s in specs] == sorted(s.stage for s in specs)
    assert {"eval-gate-smollm2-135m", "eval-gate-llama-3-1-8b", "trainer"} <= set(names)
    workers = [s for s in specs if s.module == "services.worker"]
    assert len(workers) == 4  # 2 per pool
    assert len({s.env["LPX_WORKER_WORKER_ID"] for s in workers}) == 4
    assert {s.env["LPX_WORKER_POOL"] for s in workers} == {"smollm2-135m-r16", "llama-3-1-8b-r16"}


def test_every_variable_is_a_setting_of_its_service_and_parses(tmp_path, monkeypatch):
    from services.eval_gate.settings import EvalGateSettings
    from services.gateway.settings import GatewaySettings
    from services.registry.settings import RegistrySettings
    from services.trainer.settings import TrainerSettings
    from services.worker.settings import WorkerSettings

    classes = {
        "services.registry": RegistrySettings,
        "services.gateway": GatewaySettings,
        "services.worker": WorkerSettings,
        "services.trainer": TrainerSettings,
        "services.eval_gate": EvalGateSettings,
    }
    for spec in build(tmp_path):
        cls = classes[spec.module]
        prefix = cls.model_config["env_prefix"]
        for name, value in spec.env.items():
            if name.startswith("LPX_") and name != "LPX_ENV_FILE":
                assert name.startswith(prefix), f"{spec.name}: {name}"
                assert name.removeprefix(prefix).lower() in cls.model_fields, f"{spec.name}: {name}"
                monkeypatch.setenv(name, value)
        cls(_env_file=None)
    gateway = build(tmp_path)[-1]
    assert json.loads(gateway.env["LPX_GATEWAY_BASE_MODELS"]) == ["smollm2-135m"]
    # Its metrics for `lpx top`, on loopback only.
    assert (gateway.env["LPX_GATEWAY_METRICS_PORT"], gateway.env["LPX_GATEWAY_METRICS_HOST"]) == ("9464", "127.0.0.1")


def test_workers_default_to_what_fits_and_a_request_that_does_not_fit_is_refused(monkeypatch):
    settings = UpSettings(worker_memory_gib=2.5, fixed_memory_gib=4, max_workers=4)
    monkeypatch.setattr(plan, "available_memory_gib", lambda: 10.0)
    monkeypatch.setattr(plan.os, "cpu_count", lambda: 16)
    assert plan.worker_count(settings, pools=1, requested=None) == 2  # (10 - 4) // 2.5
    assert plan.worker_count(settings, pools=1, requested=2) == 2
    with pytest.raises(PlanError, match=r"3 worker\(s\) per pool need about 12 GiB .* use --workers 2"):
        plan.worker_count(settings, pools=1, requested=3)
    monkeypatch.setattr(plan, "available_memory_gib", lambda: 5.0)
    with pytest.raises(PlanError, match="not enough memory for one worker"):
        plan.worker_count(settings, pools=1, requested=None)


def test_a_platform_already_up_is_not_sized_again(monkeypatch):
    """A second `lpx up` on a running platform: the memory its services hold is not available any more,
    and needs not be (CI: 1 worker "needed 10 GiB, 9.9 available" with that worker running)."""
    settings = UpSettings(worker_memory_gib=4, fixed_memory_gib=6, max_workers=4)
    monkeypatch.setattr(plan, "available_memory_gib", lambda: 1.0)
    monkeypatch.setattr(plan.os, "cpu_count", lambda: 16)
    running = plan.Running(workers=1, fixed=True)
    assert plan.worker_count(settings, pools=1, requested=1, running=running) == 1
    assert plan.worker_count(settings, pools=1, requested=None, running=running) == 1  # keeps what runs
    with pytest.raises(
        PlanError, match=r"2 worker\(s\) per pool .* \(1 worker\(s\) already running\): use --workers 1"
    ):
        plan.worker_count(settings, pools=1, requested=2, running=running)
    monkeypatch.setattr(plan, "available_memory_gib", lambda: 5.0)  # room for one more worker
    assert plan.worker_count(settings, pools=1, requested=2, running=running) == 2
    with pytest.raises(PlanError, match="use --workers 1"):  # the fixed share is not running: it needs 6
        plan.worker_count(settings, pools=1, requested=2, running=plan.Running(workers=1))


def test_fetched_bases_are_the_model_dirs_with_a_manifest(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / plan.MANIFEST).write_text("{}")
    (tmp_path / "half.partial").mkdir()
    assert plan.fetched_bases(tmp_path) == ["a"]
    assert plan.fetched_bases(tmp_path / "missing") == []


def test_a_crash_loop_backs_off_exponentially_and_a_long_run_restarts_at_once():
    settings = UpSettings(backoff_window_s=60, backoff_max_s=30)
    now = 1000.0
    assert backoff_s([], now, settings) == 0
    assert backoff_s([now - 3600], now, settings) == 0  # ran for an hour, then died: straight back
    assert backoff_s([now - 5], now, settings) == 1
    assert backoff_s([now - 15, now - 10, now - 5], now, settings) == 4
    assert backoff_s([now - i for i in range(1, 20)], now, settings) == 30


def test_a_taken_port_is_refused_with_the_setting_to_change(tmp_path, monkeypatch):
    from libs.up.platform import LocalPlatform

    monkeypatch.setenv("LPX_HOME", str(tmp_path))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        platform = LocalPlatform(UpSettings(gateway_port=port), stack=object())
        with pytest.raises(PlanError, match=f"port {port} for the gateway is taken .* LPX_UP_GATEWAY_PORT"):
            platform._port("gateway", port, {}, check=True)


def test_no_fetched_model_is_refused_with_the_command_that_fetches_it(tmp_path, monkeypatch):
    from libs.up.platform import LocalPlatform, UpError

    monkeypatch.setenv("LPX_HOME", str(tmp_path))
    with pytest.raises(UpError, match="lpx model fetch smollm2-135m"):
        LocalPlatform(stack=object()).up()
