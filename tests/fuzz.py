"""Property-based API fuzzing with schemathesis' CLI against a live service's own /openapi.json.

Every run uses a fixed seed and a random one (printed, so a failure can be replayed with
`schemathesis run ... --seed N`), the checks not_a_server_error, response_schema_conformance and
status_code_conformance, and the phases that apply (examples, coverage, fuzzing, stateful).
"""

from __future__ import annotations

import json
import random
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

FIXED_SEED = 20261201
CHECKS = "not_a_server_error,response_schema_conformance,status_code_conformance"
PHASES = "examples,coverage,fuzzing,stateful"


@dataclass
class FuzzRun:
    seed: int
    exit_code: int
    cases: int
    failures: int
    output: str

    def summary(self) -> str:
        return f"seed {self.seed}: {self.cases} cases, {self.failures} failures (exit {self.exit_code})"


def schemathesis_cli() -> list[str]:
    found = shutil.which("schemathesis", path=str(Path(sys.executable).parent))
    return [found] if found else [sys.executable, "-m", "schemathesis.cli"]


def fuzz(
    openapi_url: str,
    headers: dict[str, str],
    report_dir: Path,
    *,
    seed: int,
    max_examples: int = 25,
    max_time_s: int = 90,
    extra: list[str] | None = None,
) -> FuzzRun:
    ndjson = report_dir / f"events-{seed}.ndjson"
    command = [
        *schemathesis_cli(),
        "run",
        openapi_url,
        "--checks",
        CHECKS,
        "--phases",
        PHASES,
        "--max-examples",
        str(max_examples),
        "--seed",
        str(seed),
        "--workers",
        "1",
        "--max-time",
        str(max_time_s),
        "--report",
        "ndjson",
        "--report-ndjson-path",
        str(ndjson),
        "--no-color",
        *(extra or []),
    ]
    for name, value in headers.items():
        command += ["-H", f"{name}: {value}"]
    # In the report folder: schemathesis keeps a cache of crashes in `.schemathesis/` of its working folder.
    done = subprocess.run(command, capture_output=True, text=True, timeout=max_time_s * 4 + 60, cwd=report_dir)
    output = done.stdout + done.stderr
    return FuzzRun(seed, done.returncode, _cases(ndjson, output), _failures(output), output)


def seeds() -> list[int]:
    return [FIXED_SEED, random.SystemRandom().randrange(1, 2**31)]


def _cases(ndjson: Path, output: str) -> int:
    """Test cases generated, from the event stream (or the printed summary)."""
    total = 0
    if ndjson.exists():
        for line in ndjson.read_text().splitlines():
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            total += _scenario_cases(event)
    if total:
        return total
    match = re.search(r"(\d+) generated", output)
    return int(match[1]) if match else 0


def _scenario_cases(event: dict) -> int:
    finished = event.get("ScenarioFinished") or {}
    recorder = finished.get("recorder") or {}
    return len(recorder.get("cases") or {})


def _failures(output: str) -> int:
    match = re.search(r"(\d+) unique failures?", output) or re.search(r"Failures?:\s*(\d+)", output)
    return int(match[1]) if match else 0
