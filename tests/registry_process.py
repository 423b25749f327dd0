"""The registry as its own process, the way production runs it: tests that need its HTTP API or its
NATS handlers from outside (the CLI, the trainer, fuzzing) start it with `start_registry`."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import httpx

from libs.stack import procs

REPO = Path(__file__).resolve().parents[1]


def start_registry(env: dict[str, str], log: Path, timeout_s: float = 90) -> tuple[str, subprocess.Popen]:
    """`python -m services.registry` with `env` (which sets LPX_REGISTRY_PORT), output to `log`; returns
    its URL and process once /readyz answers 200. Fails with the log's tail if it exits or never gets ready."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "services.registry"], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    url = f"http://127.0.0.1:{env['LPX_REGISTRY_PORT']}"

    def ready() -> bool:
        try:
            return httpx.get(f"{url}/readyz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return proc.poll() is not None  # stop waiting if it died

    if not (procs.wait_until(ready, timeout_s) and proc.poll() is None):
        proc.kill()
        raise AssertionError(f"the registry did not get ready; last log lines:\n{log.read_text()[-3000:]}")
    return url, proc


def stop_registry(proc: subprocess.Popen, timeout_s: float = 30) -> int:
    """SIGTERM (the registry drains), then its exit code."""
    proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout=timeout_s)
