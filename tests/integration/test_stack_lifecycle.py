"""`lpx stack up|status|down` as an operator runs it: processes start, are tracked, and all go away."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.integration

LPX = [sys.executable, "-m", "libs.cli.main"]


@pytest.fixture
def state_dir(tmp_path_factory):
    path = Path(tmp_path_factory.mktemp("lpx-stack-life"))
    os.chmod(path, 0o755)
    for parent in path.parents:  # PostgreSQL (as `postgres`) must traverse down to it
        if str(parent).startswith("/tmp/") and parent.exists():
            os.chmod(parent, parent.stat().st_mode | 0o011)
    return path


def _env(state_dir: Path) -> dict:
    return {**os.environ, "LPX_STACK_DIR": str(state_dir)}


def _pids(state_dir: Path) -> dict[str, int]:
    state = state_dir / "stack.json"
    return json.loads(state.read_text())["pids"] if state.exists() else {}


def _grpc_sockets(state_dir: Path) -> list[Path]:
    """The unix sockets this stack's weed made, by kind and that kind's port. Matching any of the stack's
    ports would also catch another (killed) stack's socket whose port happens to equal one of ours."""
    ports = json.loads((state_dir / "stack.json").read_text())["ports"]
    mine = {"master": "s3_master_grpc", "volume": "s3_volume_grpc", "filer": "s3_filer_grpc", "s3": "s3_grpc"}
    mine["admin"] = "s3_admin_grpc"
    paths = [Path(f"/tmp/seaweedfs-{kind}-grpc-{ports[name]}.sock") for kind, name in mine.items()]
    return [path for path in paths if path.exists()]


def _alive(pids) -> list[int]:
    return [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def _server_processes_in(state_dir: Path) -> list[int]:
    """Any process whose command line points into this state dir (catches untracked orphans)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if any(str(state_dir) in arg for arg in proc.info["cmdline"] or []):
                found.append(proc.info["pid"])
        except psutil.Error:
            continue
    return found


def test_up_status_down_leaves_no_process_and_no_stray_file(state_dir):
    env = _env(state_dir)
    up = subprocess.run([*LPX, "stack", "up"], env=env, capture_output=True, text=True, timeout=120)
    assert up.returncode == 0, up.stderr
    pids = _pids(state_dir)
    assert set(pids) == {"nats", "postgres", "s3"} and len(_alive(pids.values())) == 3
    assert _grpc_sockets(state_dir), "weed made no grpc socket: the stray-file check below would prove nothing"

    status = subprocess.run([*LPX, "stack", "status"], env=env, capture_output=True, text=True, timeout=60)
    assert status.returncode == 0 and status.stdout.count("healthy") == 3, status.stdout

    again = subprocess.run([*LPX, "stack", "up"], env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and _pids(state_dir) == pids  # idempotent: nothing restarted
    assert "already running" in again.stderr

    down = subprocess.run([*LPX, "stack", "down"], env=env, capture_output=True, text=True, timeout=120)
    assert down.returncode == 0, down.stderr
    assert _alive(pids.values()) == [] and _server_processes_in(state_dir) == []
    assert _grpc_sockets(state_dir) == []
    assert not (state_dir / "stack.env").exists()
    status = subprocess.run([*LPX, "stack", "status"], env=env, capture_output=True, text=True, timeout=60)
    assert status.returncode == 1


def _wait_for_first_server(proc: subprocess.Popen, state_dir: Path, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = _pids(state_dir)
        if pids:
            return pids
        assert proc.poll() is None, "stack up ended before starting anything"
        time.sleep(0.02)
    raise AssertionError("no server started")


def test_sigterm_during_up_stops_what_it_started(state_dir):
    proc = subprocess.Popen(
        [*LPX, "stack", "up"], env=_env(state_dir), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    _wait_for_first_server(proc, state_dir)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    deadline = time.monotonic() + 20
    while _server_processes_in(state_dir) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _server_processes_in(state_dir) == [], err
    assert _pids(state_dir) == {}


def test_sigkill_during_up_then_down_cleans_up(state_dir):
    proc = subprocess.Popen(
        [*LPX, "stack", "up"], env=_env(state_dir), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    _wait_for_first_server(proc, state_dir)
    time.sleep(0.3)
    proc.kill()
    proc.wait(timeout=30)
    assert _server_processes_in(state_dir), "expected servers left behind by a SIGKILLed up"
    down = subprocess.run([*LPX, "stack", "down"], env=_env(state_dir), capture_output=True, text=True, timeout=120)
    assert down.returncode == 0, down.stderr
    assert _server_processes_in(state_dir) == []
    assert _grpc_sockets(state_dir) == []
