"""Process bookkeeping for servers the stack started: free ports, liveness, termination."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import time
from pathlib import Path

import psutil


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago (the server binds it right after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def free_ports(count: int) -> list[int]:
    """`count` distinct free ports. Sockets stay bound until all are chosen so none repeats."""
    sockets, ports = [], []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
            ports.append(sock.getsockname()[1])
    finally:
        for sock in sockets:
            sock.close()
    return ports


def is_ours(pid: int | None, executable: str) -> bool:
    """True if `pid` is alive and runs `executable` (guards against a recycled pid)."""
    if not pid:
        return False
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        cmdline = proc.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
    return bool(cmdline) and os.path.basename(cmdline[0]) == os.path.basename(executable)


def terminate(pid: int, stop_signal: int = signal.SIGTERM, timeout_s: float = 15.0) -> None:
    """Stop a server and its process group: polite signal first, SIGKILL after `timeout_s`."""
    try:
        proc = psutil.Process(pid)
        children = proc.children(recursive=True)
    except psutil.NoSuchProcess:
        return
    try:
        proc.send_signal(stop_signal)
    except psutil.NoSuchProcess:
        return
    gone, alive = psutil.wait_procs([proc, *children], timeout=timeout_s)
    for straggler in alive:
        try:
            straggler.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5)
    _kill_group(pid)


def _kill_group(pgid: int) -> None:
    # Servers are started in their own session, so their pgid is their pid: sweep any leftovers.
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def wait_until(predicate, timeout_s: float, interval_s: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return predicate()


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A killed child of ours stays a zombie until reaped; that counts as gone.
    with contextlib.suppress(Exception):
        import psutil

        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    return True


def mask(endpoint: str) -> str:
    """Hide the password in a DSN for display."""
    return re.sub(r"(://[^:/@]+:)[^@]+@", r"\1***@", endpoint)


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
