"""`benchmarks/RESULTS.md`: every benchmark run a README figure may quote, dated, with the commit, the
machine and the command that produced it. A benchmark appends its summary; nothing is ever rewritten."""

from __future__ import annotations

import datetime as dt
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
_HEADER = (
    "# Benchmark results\n\nAppended by `make bench` (each benchmark adds its run: date, commit, machine, "
    "command). The README quotes these runs by their heading.\n"
)


def commit() -> str:
    """The short commit, with `+dirty` when the working tree has uncommitted changes."""
    root = RESULTS.parents[1]
    try:
        sha = subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], cwd=root, text=True).strip()
        dirty = (
            subprocess.run(
                ["git", "diff", "--quiet", "HEAD", "--", "libs", "services", "benchmarks"], cwd=root
            ).returncode
            != 0
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return sha + ("+dirty" if dirty else "")


def machine() -> str:
    cores = os.cpu_count() or 0
    gpu = _gpu_name()
    return f"{platform.machine()}, {cores} cores" + (f", {gpu}" if gpu else ", no GPU") + f", {platform.system()}"


def _gpu_name() -> str | None:
    try:
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:
        return None


def record(title: str, body: str, *, ran_at: str | None = None, path: Path = RESULTS) -> str:
    """Append one run; returns its heading (what the README cites). `ran_at`: the commit taken when the
    run started (`commit()` then), since the tree may change while a long benchmark runs."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    heading = f"{title}, {stamp}, {ran_at or commit()}"
    command = shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]]) if sys.argv and sys.argv[0] else "?"
    text = path.read_text() if path.exists() else _HEADER
    text += f"\n## {heading}\n\n- machine: {machine()}\n- command: `{command}`\n\n{body.strip()}\n"
    path.write_text(text)
    return heading
