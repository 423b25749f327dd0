"""supervisord as the process supervisor of `lpx up` (pip `supervisor`).

Chosen over a hand-written supervisor: it is the well-kept standard for exactly this (restart on exit,
a stop signal then a kill after a grace period, a process group per service so vLLM's engine processes
go with their worker, per-service log files with rotation), runs without root or Docker, and has an
XML-RPC API over a unix socket that `lpx ps|restart|down` use. Every program is configured with
`autostart=false`: `lpx up` starts them itself, stage by stage, waiting for each stage to be healthy.
"""

from __future__ import annotations

import configparser
import subprocess
import sys
import time
import xmlrpc.client
from dataclasses import dataclass
from pathlib import Path

from libs.up.plan import ServiceSpec

# supervisord's process states (supervisor.states.ProcessStates) by name.
RUNNING, STARTING, BACKOFF, FATAL, STOPPED, EXITED = "RUNNING", "STARTING", "BACKOFF", "FATAL", "STOPPED", "EXITED"


class SupervisorError(RuntimeError):
    pass


@dataclass(frozen=True)
class ProcessInfo:
    name: str
    state: str
    pid: int
    started_at: float
    description: str


class Supervisor:
    def __init__(self, state: Path) -> None:
        self.state = state
        self.conf = state / "supervisord.conf"
        self.sock = state / "supervisor.sock"
        self.pidfile = state / "supervisord.pid"
        self.logs = state / "logs"

    # --- configuration -------------------------------------------------------------------------
    def write_config(self, specs: list[ServiceSpec]) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        conf = configparser.RawConfigParser()
        conf["unix_http_server"] = {"file": str(self.sock), "chmod": "0700"}
        conf["supervisord"] = {
            "logfile": str(self.logs / "supervisord.log"),
            "pidfile": str(self.pidfile),
            "childlogdir": str(self.logs),
            "directory": str(self.state),
            "nodaemon": "false",
            "silent": "true",
        }
        conf["rpcinterface:supervisor"] = {
            "supervisor.rpcinterface_factory": "supervisor.rpcinterface:make_main_rpcinterface"
        }
        conf["supervisorctl"] = {"serverurl": f"unix://{self.sock}"}
        for spec in specs:
            conf[f"program:{spec.name}"] = self._program(spec)
        with self.conf.open("w") as out:
            conf.write(out)

    def _program(self, spec: ServiceSpec) -> dict[str, str]:
        return {
            "command": f"{sys.executable} -m libs.up.runner {self.state} {spec.name}",
            "autostart": "false",
            "autorestart": "true",
            # A start counts as successful after 3 s; dying sooner 5 times in a row is FATAL (crash loop).
            "startsecs": "3",
            "startretries": "5",
            "stopsignal": "TERM",
            "stopwaitsecs": str(spec.stop_wait_s),
            "stopasgroup": "true",
            "killasgroup": "true",
            "redirect_stderr": "true",
            "stdout_logfile": str(self.log_path(spec.name)),
            "stdout_logfile_maxbytes": "20MB",
            "stdout_logfile_backups": "3",
        }

    def log_path(self, name: str) -> Path:
        return self.logs / f"{name}.log"

    # --- the daemon ----------------------------------------------------------------------------
    def running(self) -> bool:
        if not self.sock.exists():
            return False
        try:
            return self.rpc().supervisor.getState()["statename"] == "RUNNING"
        except (OSError, xmlrpc.client.Fault):
            return False

    def start_daemon(self) -> None:
        """supervisord in the background (it daemonizes); returns once its API answers."""
        self.sock.unlink(missing_ok=True)
        done = subprocess.run(
            [sys.executable, "-m", "supervisor.supervisord", "-c", str(self.conf)],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if done.returncode != 0:
            raise SupervisorError(f"supervisord did not start: {(done.stderr or done.stdout).strip()[-500:]}")
        deadline = time.monotonic() + 15
        while not self.running():
            if time.monotonic() > deadline:
                raise SupervisorError(f"supervisord did not answer on {self.sock} (log {self.logs}/supervisord.log)")
            time.sleep(0.1)

    def reload(self) -> None:
        """Pick up a changed configuration (programs added or removed) without touching the others."""
        added, changed, removed = self.rpc().supervisor.reloadConfig()[0]
        for name in removed + changed:
            self.stop(name)
            self.rpc().supervisor.removeProcessGroup(name)
        for name in added + changed:
            self.rpc().supervisor.addProcessGroup(name)

    def shutdown(self, timeout_s: float = 30) -> None:
        try:
            self.rpc().supervisor.shutdown()
        except (OSError, xmlrpc.client.Fault):
            return
        deadline = time.monotonic() + timeout_s
        while self.sock.exists() and time.monotonic() < deadline:
            time.sleep(0.1)

    # --- processes -----------------------------------------------------------------------------
    def rpc(self):
        from supervisor.xmlrpc import SupervisorTransport

        transport = SupervisorTransport(None, None, f"unix://{self.sock}")
        return xmlrpc.client.ServerProxy("http://127.0.0.1", transport=transport)

    def start(self, name: str) -> None:
        try:
            self.rpc().supervisor.startProcess(name, False)
        except xmlrpc.client.Fault as fault:
            if "ALREADY_STARTED" not in fault.faultString:
                raise SupervisorError(f"{name}: {fault.faultString}") from None

    def stop(self, name: str) -> None:
        try:
            self.rpc().supervisor.stopProcess(name, True)  # waits: SIGTERM, stopwaitsecs, then SIGKILL
        except xmlrpc.client.Fault as fault:
            if "NOT_RUNNING" not in fault.faultString and "BAD_NAME" not in fault.faultString:
                raise SupervisorError(f"{name}: {fault.faultString}") from None

    def stop_all(self) -> None:
        self.rpc().supervisor.stopAllProcesses(True)

    def processes(self) -> dict[str, ProcessInfo]:
        rows = self.rpc().supervisor.getAllProcessInfo()
        return {
            row["name"]: ProcessInfo(row["name"], row["statename"], row["pid"], row["start"], row["description"])
            for row in rows
        }
