"""`python -m libs.up.runner STATE NAME`: what supervisord runs for each service.

Kills what the previous run left in its process group (vLLM's engine processes outlive a SIGKILLed
worker), records the start (the restart count and crash-loop detection of `lpx ps` come from these
records), waits first when the service is crash-looping (exponential backoff; supervisord's own backoff only
covers a process dying within its first seconds), then becomes the service (exec: same pid, so
supervisord's signals reach it directly).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path

from libs.up.settings import UpSettings


def starts_file(state: Path, name: str) -> Path:
    return state / "starts" / f"{name}.jsonl"


def read_starts(state: Path, name: str) -> list[float]:
    path = starts_file(state, name)
    if not path.exists():
        return []
    return [json.loads(line)["t"] for line in path.read_text().splitlines() if line.strip()]


def backoff_s(starts: list[float], now: float, settings: UpSettings) -> float:
    """0 unless the service started recently; then 1, 2, 4... s per recent start, capped."""
    recent = [t for t in starts if now - t < settings.backoff_window_s]
    if not recent:
        return 0.0
    return min(settings.backoff_max_s, 2.0 ** (len(recent) - 1))


def leftovers(pgid: int) -> list[int]:
    """Processes still in the process group of a previous run. supervisord makes every service a group
    leader; a service killed with SIGKILL leaves its children (vLLM's engine core and its workers, GBs
    of memory each) running in that group, re-parented to init."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        if int(fields[2]) == pgid and int(stat.parent.name) != os.getpid():
            found.append(int(stat.parent.name))
    return found


def reap_previous_run(state: Path, name: str) -> None:
    records = starts_file(state, name)
    if not records.exists():
        return
    lines = [json.loads(line) for line in records.read_text().splitlines() if line.strip()]
    previous = lines[-1].get("pid") if lines else None
    stray = leftovers(previous) if previous else []
    if stray:
        print(f"[lpx up] {name}: killing {len(stray)} leftover process(es) of its previous run: {stray}", flush=True)
        for pid in stray:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def main(argv: list[str]) -> None:
    state, name = Path(argv[0]), argv[1]
    spec = json.loads((state / "services" / f"{name}.json").read_text())
    settings = UpSettings()
    starts = read_starts(state, name)
    delay = backoff_s(starts, time.time(), settings)
    if delay:
        recent = sum(1 for t in starts if time.time() - t < settings.backoff_window_s)
        print(
            f"[lpx up] {name} started {recent} time(s) in the last {settings.backoff_window_s:.0f}s: "
            f"restarting in {delay:.0f}s",
            flush=True,
        )
        time.sleep(delay)
    reap_previous_run(state, name)
    path = starts_file(state, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as out:
        out.write(json.dumps({"t": time.time(), "pid": os.getpid()}) + "\n")
    env = {**os.environ, **spec["env"]}
    os.execve(sys.executable, [sys.executable, "-m", spec["module"]], env)


if __name__ == "__main__":
    main(sys.argv[1:])
