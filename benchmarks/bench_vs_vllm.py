"""loraplex beside vLLM's own OpenAI server, the choice of a team that does not adopt a platform.

One run, same machine (each peer alone on it during its run), same engine settings (SmolLM2-135M,
float32 on CPU / bf16 on GPU, enforce-eager, max_loras 2, max_cpu_loras 8, max_lora_rank 16), same
request sets, alternating A B A:
  A = `vllm serve --enable-lora --lora-modules a0=... a5=...` (a process of its own)
  B = loraplex: the gateway process -> NATS -> a worker process (one vLLM engine) on the same adapters,
      pushed through the registry under the same names.
Three mixes: one adapter; a working set within max_loras (2 adapters); a working set 3x max_loras
(6 adapters) with the base model mixed in. Every request is streamed (TTFT), greedy.
Printed: throughput, p50/p95 latency and TTFT p50 per run, loraplex/vllm ratios, and whether the
outputs are identical text for text; then where loraplex's time goes, stage by stage (mean ms per
request, from the gateway's `lpx_gateway_stage` histogram scraped before and after each run), and what
it adds around the engine (every stage but prefill and decode). JSON and a plot in --out.

The vLLM peer runs vLLM's own CPU LoRA ops (`LPX_CPU_LORA_OPS=vllm`) with only loraplex's correctness
fix for base-model rows (vLLM PR #48421): as shipped, vLLM-CPU applies the last adapter to base-model
requests batched with adapter requests, and its outputs could not be compared. loraplex's worker runs
its defaults: segment-grouped LoRA ops and adapter-aware admission.
"""

from __future__ import annotations

import argparse
import asyncio
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

import re  # noqa: E402

import httpx  # noqa: E402

from benchmarks.bench_gateway import free_port, wait_ready  # noqa: E402
from benchmarks.registry_inproc import adapter_files, admin_client, start_registry  # noqa: E402
from libs.engine.vllm_serve import start_vllm_serve, wait_http  # noqa: E402
from libs.models.bootstrap import fetch  # noqa: E402
from libs.settings import ConnectionSettings  # noqa: E402
from libs.stack import Stack, StackConfig  # noqa: E402

BASE = "smollm2-135m"
POOL = "bench-vs-vllm-r16"
ADAPTERS = [f"a{i}" for i in range(6)]
MIXES = {"one adapter": ["a0"], "within max_loras (2)": ["a0", "a1"], "3x max_loras (6) + base": [*ADAPTERS, BASE]}
MAX_LORAS, MAX_CPU_LORAS = 2, 8


def make_adapters(base: Path, root: Path) -> dict[str, Path]:
    from libs.lora.train import LoraRecipe, random_adapters

    outs = {100 + i: root / name for i, name in enumerate(ADAPTERS)}
    random_adapters(base, outs, LoraRecipe(rank=16), scale=0.05)
    return {name: outs[100 + i] for i, name in enumerate(ADAPTERS)}


async def setup_registry(connections: ConnectionSettings, adapters: dict[str, Path]):
    """The registry in-process: a tenant whose aliases a0..a5 are the same adapter files vllm serve loads."""
    app, lifespan = await start_registry(connections, "lpx_bench_vs_vllm")
    async with admin_client(app) as admin:
        key = (await admin.post("/v1/tenants", json={"name": "bench"})).raise_for_status().json()["api_key"]
        for adapter, path in adapters.items():
            form = {"tenant": "bench", "adapter": adapter, "base_model": BASE}
            reply = await admin.post("/v1/adapters", data=form, files=adapter_files(path))
            number = reply.raise_for_status().json()["version"]["number"]
            url = f"/v1/tenants/bench/adapters/{adapter}/versions/{number}/activate"
            (await admin.post(url, json={"actor": "bench", "reason": "bench_vs_vllm"})).raise_for_status()
    return key, lifespan


def requests_for(mix: list[str], n: int) -> list[tuple[str, list[dict]]]:
    return [(mix[i % len(mix)], [{"role": "user", "content": f"Customer {i}: where is my order? Explain shipping."}])
            for i in range(n)]  # fmt: skip


async def one(http: httpx.AsyncClient, model: str, messages, max_tokens: int, slots: asyncio.Semaphore) -> dict:
    async with slots:
        started = time.perf_counter()
        ttft, text, tokens = None, "", 0
        body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}}  # fmt: skip
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
        return {"model": model, "latency_s": time.perf_counter() - started, "ttft_s": ttft or 0.0,
                "tokens": tokens, "text": text}  # fmt: skip


async def run(url: str, key: str, mix: list[str], args) -> dict:
    slots = asyncio.Semaphore(args.concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=900, headers={"Authorization": f"Bearer {key}"},
                                 limits=httpx.Limits(max_connections=args.concurrency * 2)) as http:  # fmt: skip
        started = time.perf_counter()
        samples = await asyncio.gather(*(one(http, m, msgs, args.tokens, slots)
                                         for m, msgs in requests_for(mix, args.requests)))  # fmt: skip
        wall = time.perf_counter() - started
    lat = sorted(s["latency_s"] for s in samples)
    return {"wall_s": wall, "tokens": sum(s["tokens"] for s in samples),
            "tok_per_s": sum(s["tokens"] for s in samples) / wall, "latency_p50_s": statistics.median(lat),
            "latency_p95_s": lat[min(len(lat) - 1, int(0.95 * len(lat)))],
            "ttft_p50_s": statistics.median(s["ttft_s"] for s in samples), "samples": list(samples)}  # fmt: skip


def start_worker(env_file: Path, base: Path, state: Path) -> subprocess.Popen:
    """loraplex's worker as its own process (one vLLM engine), as deployed."""
    env = {**os.environ, "LPX_ENV_FILE": str(env_file), "LPX_WORKER_WORKER_ID": "bench-vs", "LPX_WORKER_POOL": POOL,
           "LPX_WORKER_BASE_MODEL": BASE, "LPX_WORKER_MODEL_PATH": str(base), "LPX_WORKER_CAPACITY": "32",
           "LPX_WORKER_MAX_LORAS": str(MAX_LORAS), "LPX_WORKER_MAX_CPU_LORAS": str(MAX_CPU_LORAS),
           "LPX_WORKER_DISK_CACHE_DIR": str(state / "disk-cache"), "LPX_WORKER_LOG_LEVEL": "WARNING",
           "VLLM_CPU_KVCACHE_SPACE": "1"}  # fmt: skip
    with open(state / "worker.log", "a") as log:
        return subprocess.Popen([sys.executable, "-m", "services.worker"], env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip


def stop(proc: subprocess.Popen | None, timeout_s: float = 120) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()  # the worker drains; vllm's server shuts its engine down
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait(10)


async def main_async(args) -> dict:
    """Each peer runs ALONE: its engine is started for its run and stopped after it, so the two never
    share the machine's cores (on 2 cores an idle second engine halves the other's throughput)."""
    base = fetch(BASE).path
    state = Path(tempfile.mkdtemp(prefix="lpx-bench-vs-vllm-"))
    os.chmod(state, 0o755)
    adapters = make_adapters(base, state / "adapters")
    stack = Stack(StackConfig(dir=state / "stack"))
    stack.up()
    connections = ConnectionSettings.load(stack.env_file)
    vllm_port, gw_port, metrics_port = free_port(), free_port(), free_port()
    registry = gateway = None
    try:
        key, registry = await setup_registry(connections, adapters)
        env = {**os.environ, "LPX_ENV_FILE": str(stack.env_file), "LPX_GATEWAY_PORT": str(gw_port),
               "LPX_GATEWAY_HOST": "127.0.0.1", "LPX_GATEWAY_LOG_LEVEL": "WARNING",
               "LPX_GATEWAY_METRICS_PORT": str(metrics_port)}  # fmt: skip
        with open(state / "gateway.log", "w") as log:
            gateway = subprocess.Popen([sys.executable, "-m", "services.gateway"], env=env, stdout=log,
                                       stderr=subprocess.STDOUT)  # fmt: skip
        lpx_url, vllm_url = f"http://127.0.0.1:{gw_port}", f"http://127.0.0.1:{vllm_port}"
        warm = argparse.Namespace(**{**vars(args), "requests": 7})

        async def start_peer(peer: str) -> subprocess.Popen:
            if peer == "vllm serve":
                proc = start_vllm_serve(base, adapters, vllm_port, state / "vllm-serve.log", served_name=BASE,
                                        max_loras=MAX_LORAS, max_cpu_loras=MAX_CPU_LORAS)  # fmt: skip
                await wait_http(vllm_url, proc)
            else:
                proc = start_worker(stack.env_file, base, state)
                await wait_ready(lpx_url, gateway, 1, timeout=600)
            return proc

        peers = {"vllm serve": (vllm_url, "none"), "loraplex": (lpx_url, key)}
        results = {}
        for mix_name, mix in MIXES.items():
            runs = {}
            for peer, i in [("vllm serve", 1), ("loraplex", 1), ("vllm serve", 2)]:  # A B A
                url, k = peers[peer]
                proc = await start_peer(peer)
                try:
                    await run(url, k, MIXES["3x max_loras (6) + base"], warm)  # adapter loads, first requests
                    before = await scrape_stages(metrics_port) if peer == "loraplex" else {}
                    runs[f"{peer} #{i}"] = await run(url, k, mix, args)
                    if peer == "loraplex":
                        runs[f"{peer} #{i}"]["stages_ms"] = stage_means(before, await scrape_stages(metrics_port))
                finally:
                    stop(proc)
                    if peer == "loraplex":
                        await wait_gone(lpx_url)
                print(f"  {mix_name}: {peer} #{i} {runs[f'{peer} #{i}']['tok_per_s']:.1f} tok/s", flush=True)
            results[mix_name] = runs
    finally:
        stop(gateway, 30)
        if registry is not None:
            await registry.__aexit__(None, None, None)
        stack.purge()
    return report(results, args)


_STAGE_LINE = re.compile(r'^lpx_gateway_stage\w*_(sum|count)\{[^}]*stage="(\w+)"[^}]*\} (\S+)$')


async def scrape_stages(port: int) -> dict[tuple[str, str], float]:
    """(stage, 'sum'|'count') -> value, from the gateway's Prometheus endpoint."""
    async with httpx.AsyncClient(timeout=10) as http:
        text = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
    found = {}
    for line in text.splitlines():
        match = _STAGE_LINE.match(line)
        if match:
            found[(match.group(2), match.group(1))] = float(match.group(3))
    return found


def stage_means(before: dict, after: dict) -> dict[str, float]:
    """Mean milliseconds per request for each stage, over the requests between the two scrapes."""
    from services.gateway.timeline import STAGES

    means = {}
    for stage in STAGES:
        count = after.get((stage, "count"), 0.0) - before.get((stage, "count"), 0.0)
        total = after.get((stage, "sum"), 0.0) - before.get((stage, "sum"), 0.0)
        if count > 0:
            means[stage] = 1000 * total / count
    return means


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


def _added_ms(stages_ms: dict[str, float]) -> float:
    """What loraplex adds around the engine: every stage but prefill and decode (mean ms per request)."""
    from services.gateway.timeline import ENGINE_STAGES

    return sum(v for k, v in stages_ms.items() if k not in ENGINE_STAGES)


def report(results: dict, args) -> dict:
    mixes = {}
    for mix_name, runs in results.items():
        a = [runs["vllm serve #1"], runs["vllm serve #2"]]
        b = runs["loraplex #1"]

        def ratio(key: str, a=a, b=b) -> float:
            return b[key] / statistics.mean(r[key] for r in a)

        same = sum(x["text"] == y["text"] for x, y in zip(a[0]["samples"], b["samples"], strict=True))
        mixes[mix_name] = {"runs": runs, "throughput_ratio": ratio("tok_per_s"), "p50_ratio": ratio("latency_p50_s"),
                           "p95_ratio": ratio("latency_p95_s"), "ttft_p50_ratio": ratio("ttft_p50_s"),
                           "identical_outputs": same, "requests": len(b["samples"]),
                           "added_ms": _added_ms(b.get("stages_ms", {}))}  # fmt: skip
    return {"workload": {"requests": args.requests, "concurrency": args.concurrency, "max_tokens": args.tokens,
                         "max_loras": MAX_LORAS, "max_cpu_loras": MAX_CPU_LORAS, "model": BASE, "greedy": True},
            "mixes": mixes}  # fmt: skip


def render(rep: dict, out: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    w = rep["workload"]
    table = Table(title=f"loraplex vs vllm serve ({w['requests']} streamed chat requests, {w['concurrency']} "
                        f"concurrent, {w['max_tokens']} tokens, max_loras {w['max_loras']}, A B A)")  # fmt: skip
    for col in ("mix", "run", "tok/s", "p50", "p95", "TTFT p50"):
        table.add_column(col)
    for mix_name, m in rep["mixes"].items():
        for run_name, r in m["runs"].items():
            table.add_row(mix_name, run_name, f"{r['tok_per_s']:.1f}", f"{r['latency_p50_s']:.2f}s",
                          f"{r['latency_p95_s']:.2f}s", f"{r['ttft_p50_s']:.2f}s")  # fmt: skip
    console.print(table)
    ratios = Table(title="loraplex / vllm serve (mean of the two vllm runs)")
    for col in ("mix", "throughput", "p50", "p95", "TTFT p50", "identical outputs"):
        ratios.add_column(col)
    for mix_name, m in rep["mixes"].items():
        ratios.add_row(mix_name, f"{m['throughput_ratio']:.2f}x", f"{m['p50_ratio']:.2f}x", f"{m['p95_ratio']:.2f}x",
                       f"{m['ttft_p50_ratio']:.2f}x", f"{m['identical_outputs']}/{m['requests']}")  # fmt: skip
    console.print(ratios)
    _render_stages(console, rep)
    out.mkdir(parents=True, exist_ok=True)
    (out / "vs_vllm.json").write_text(json.dumps(rep, indent=2))
    _plot(rep, out / "vs_vllm.png")
    console.print(f"wrote {out / 'vs_vllm.json'} and {out / 'vs_vllm.png'}")


def _render_stages(console, rep: dict) -> None:
    from rich.table import Table

    from services.gateway.timeline import STAGES

    table = Table(title="where loraplex's time goes: mean ms per request by stage (gateway accept -> reply sent)")
    table.add_column("stage")
    mixes = {name: m["runs"]["loraplex #1"].get("stages_ms", {}) for name, m in rep["mixes"].items()}
    for name in mixes:
        table.add_column(name.split(" (")[0], justify="right")
    for stage in STAGES:
        table.add_row(stage, *(f"{stages.get(stage, float('nan')):.1f}" for stages in mixes.values()))
    table.add_row("added around the engine", *(f"{_added_ms(st):.1f}" for st in mixes.values()))
    console.print(table)


def _plot(rep: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(rep["mixes"])
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    panels = (("tok_per_s", "tok/s"), ("latency_p50_s", "p50 latency (s)"), ("ttft_p50_s", "TTFT p50 (s)"))
    for ax, (key, label) in zip(axes, panels, strict=True):
        for j, run_name in enumerate(("vllm serve #1", "loraplex #1", "vllm serve #2")):
            ax.bar([i + (j - 1) * 0.27 for i in range(len(names))],
                   [rep["mixes"][n]["runs"][run_name][key] for n in names], 0.27, label=run_name)  # fmt: skip
        ax.set_xticks(range(len(names)), [n.split(" (")[0] for n in names], fontsize=8)
        ax.set_ylabel(label)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    parser.add_argument("--requests", type=int, default=32, help="requests per run")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=32, help="max_tokens per request")
    args = parser.parse_args()
    render(asyncio.run(main_async(args)), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
