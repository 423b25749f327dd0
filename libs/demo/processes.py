"""Start loraplex services as real child processes for the demo, and stop them afterwards."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx


class ServiceProcess:
    """`python -m services.<name>` with extra env; its output goes to a log file."""

    def __init__(self, name: str, module: str, env: dict[str, str], log_dir: Path) -> None:
        self.name = name
        self.module = module
        self.env = {**os.environ, **env}
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"{name}.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> ServiceProcess:
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", self.module], env=self.env, stdout=self._log,
                                     stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        return self

    def check_alive(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            tail = self.log_path.read_text(errors="replace").splitlines()[-20:]
            raise RuntimeError(f"{self.name} exited; last log lines:\n" + "\n".join(tail))

    def wait_http(self, url: str, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                if httpx.get(url, timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise TimeoutError(f"{self.name} not healthy at {url} after {timeout_s:.0f}s (log: {self.log_path})")

    def stop(self, timeout_s: float = 120) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)  # services drain on SIGTERM
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        self._log.close()

    def __enter__(self) -> ServiceProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
