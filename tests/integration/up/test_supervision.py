"""`lpx up`'s supervision with the real supervisord and the real runner, on stand-in services (the
real platform under `lpx up` is tests/e2e/up): a SIGKILLed service is back within seconds with its
restart counted, a service that keeps crashing shows as crash-looping with its last log lines, a
first start that fails leaves nothing running, and a second start of a running platform is a no-op."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from libs.up.plan import ServiceSpec
from libs.up.platform import LocalPlatform, UpError
from libs.up.settings import UpSettings

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[3]


class NoStack:
    """The supervision does not need the servers; `lpx up` with them is the e2e test."""

    def status(self):
        return []

    def up(self, on_event=None):
        return {}

    def down(self, on_event=None):
        pass

    def purge(self):
        pass


def toy(name: str, flag: Path, stage: int = 0) -> ServiceSpec:
    env = {"PYTHONPATH": str(ROOT), "TOY_CRASH_FLAG": str(flag)}
    return ServiceSpec(name, "tests.integration.up.toy_service", env, stage=stage, stop_wait_s=5)


@pytest.fixture
def platform(tmp_path, monkeypatch):
    monkeypatch.setenv("LPX_HOME", str(tmp_path / "home"))
    settings = UpSettings(start_timeout_s=30, backoff_window_s=20)
    platform = LocalPlatform(settings, stack=NoStack())
    yield platform
    platform.down()
    assert not platform.supervisor.running()


def wait_for(predicate, timeout_s: float = 30):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError("condition not reached in time")


def rows(platform) -> dict:
    return {row.name: row for row in platform.ps()}


def test_a_sigkilled_service_is_back_within_seconds_and_its_restart_is_counted(platform, tmp_path):
    platform.run_services([toy("alpha", tmp_path / "never"), toy("beta", tmp_path / "never", stage=1)])
    before = rows(platform)
    assert [before[n].state for n in ("alpha", "beta")] == ["running", "running"]
    assert before["alpha"].restarts == 0 and before["alpha"].health == "ok"

    os.kill(before["alpha"].pid, signal.SIGKILL)
    killed_at = time.monotonic()
    after = wait_for(lambda: (r := rows(platform))["alpha"].pid not in (None, before["alpha"].pid) and r)
    assert time.monotonic() - killed_at < 10
    assert after["alpha"].state == "running" and after["alpha"].restarts == 1
    assert after["beta"].pid == before["beta"].pid and after["beta"].restarts == 0  # the others untouched


def test_a_service_that_keeps_crashing_shows_as_crash_looping_with_its_last_log_lines(platform, tmp_path):
    flag = tmp_path / "crash"
    platform.run_services([toy("alpha", flag)])
    flag.touch()
    os.kill(rows(platform)["alpha"].pid, signal.SIGKILL)
    looping = wait_for(lambda: (r := rows(platform)["alpha"]).state == "crash-looping" and r)
    assert any("simulated crash" in line for line in looping.last_lines)
    assert looping.pid is None

    flag.unlink()  # fixed: a restart brings it back
    platform.restart("alpha")
    assert wait_for(lambda: rows(platform)["alpha"].state == "running")


def test_a_first_start_that_fails_leaves_nothing_running(platform, tmp_path):
    flag = tmp_path / "crash"
    flag.touch()
    with pytest.raises(UpError, match="keeps exiting at start-up") as failure:
        platform.run_services([toy("alpha", tmp_path / "never"), toy("broken", flag, stage=1)])
    assert "simulated crash" in str(failure.value)
    assert not platform.supervisor.running()
    assert platform.ps() == []


def test_a_second_start_reports_what_runs_and_starts_only_what_is_missing(platform, tmp_path):
    specs = [toy("alpha", tmp_path / "never")]
    platform.run_services(specs)
    pid = rows(platform)["alpha"].pid
    events = []
    platform.run_services([*specs, toy("beta", tmp_path / "never", stage=1)], on_event=events.append)
    assert any("alpha: already running" in e for e in events)
    now = rows(platform)
    assert now["alpha"].pid == pid and now["beta"].state == "running"


def test_an_unknown_service_name_is_refused_with_the_known_ones(platform, tmp_path):
    platform.run_services([toy("alpha", tmp_path / "never")])
    with pytest.raises(UpError, match="no service 'gamma'; the services are: alpha"):
        platform.restart("gamma")
