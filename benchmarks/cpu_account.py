"""CPU seconds by kind of process over a stretch of a benchmark: where a peer's cycles go on a machine
whose cores the engine and everything around it share (the engine, its front process, the gateway, the
broker, the benchmark's own client).

Read from every process on the machine (psutil), so children started or reaped in between count too:
a process that ended before the second reading is missed, which the benchmarks' peers never do mid-run.
"""

from __future__ import annotations

import os

import psutil

# (kind, what its name or command line contains), first match wins.
KINDS = (
    ("engine", "EngineCore"),
    ("model runner", "VLLM::Worker"),  # vLLM's executor process, where the model's forward passes run
    ("vllm server", "APIServer"),
    ("vllm server", "vllm.entrypoints"),
    ("worker", "services.worker"),
    ("gateway", "services.gateway"),
    ("registry", "services.registry"),
    ("nats", "nats-server"),
    ("postgres", "postgres"),
    ("s3", "weed"),
)


def kind_of(name: str, cmdline: str, pid: int, me: int) -> str:
    if pid == me:
        return "bench client"
    text = f"{name} {cmdline}"
    return next((kind for kind, marker in KINDS if marker in text), f"other: {name or '?'}")


def snapshot() -> dict[int, tuple[str, float]]:
    """pid -> (kind, CPU seconds so far, user + system)."""
    me, out = os.getpid(), {}
    for proc in psutil.process_iter(["name", "cmdline", "cpu_times"]):
        info = proc.info
        times = info.get("cpu_times")
        if times is None:
            continue
        cmdline = " ".join(info.get("cmdline") or ())
        if not cmdline:  # a kernel thread (kworker...): renamed as it works, and not a peer's
            continue
        out[proc.pid] = (kind_of(info.get("name") or "", cmdline, proc.pid, me), times.user + times.system)
    return out


def spent(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds by kind between two snapshots (a process new in `after` counts from its start)."""
    totals: dict[str, float] = {}
    for pid, (kind, seconds) in after.items():
        earlier = before.get(pid)
        used = seconds - earlier[1] if earlier is not None and earlier[0] == kind else seconds
        if used > 0:
            totals[kind] = totals.get(kind, 0.0) + used
    return dict(sorted(totals.items(), key=lambda kv: -kv[1]))
