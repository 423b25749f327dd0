"""Fairness on the real engine: a calm tenant's latency while another tenant floods one vLLM worker.

One real worker (vLLM, default settings), one gateway, two tenants each with its own rank-16 adapter:
the flooder sends `--flood` chat requests at once, the calm tenant `--calm` requests one per
`--calm-every` seconds, `--tokens` tokens each, greedy, streamed. Three runs, side by side:

  calm alone       the calm tenant's solo figures (the reference of every ratio)
  fair (default)   the flood and the calm tenant, on today's defaults (gateway fair queuing, the
                   worker's latency guard)
  FIFO             the same traffic with fair queuing off at the gateway and the worker's guard off

Reported: the calm tenant's latency and TTFT p50/p95 and their ratio to alone, the flood's tokens/s
and the total tokens/s against FIFO, and whether every answer came from its tenant's adapter (each
answer is compared with that tenant's answer to the same prompt asked alone). With --compare-sim the
three runs are repeated on the simulated engine following the shipped engine profile, and its figures
are printed as ratios to the real engine's. JSON in --out.
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
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import httpx

from benchmarks.bench_gateway import free_port, wait_ready
from benchmarks.bench_vs_vllm import one, start_worker, stop, wait_gone
from benchmarks.registry_inproc import adapter_files, admin_client, start_registry
from benchmarks.results_log import commit, record
from libs.engine.profile import default_profile_path
from libs.models.bootstrap import fetch
from libs.settings import ConnectionSettings
from libs.stack import Stack, StackConfig

BASE, ADAPTER = "smollm2-135m", "tone"
CALM, FLOOD = "calm", "flood"
PROMPT = [{"role": "user", "content": "Where is my order? Explain the shipping process."}]
GUARD_OFF = {"LPX_WORKER_LATENCY_GUARD": "false"}
RUNS = (  # name, flood?, gateway env, worker env
    ("calm alone", False, {}, {}),
    ("fair (default)", True, {}, {}),
    ("FIFO", True, {"LPX_GATEWAY_FAIR_QUEUING": "false"}, GUARD_OFF),
)


async def setup_tenants(connections: ConnectionSettings, root: Path, base: Path) -> tuple[dict[str, str], object]:
    """Both tenants, each with its own adapter active (pushed and activated by the admin: the gate is
    not what this measures)."""
    from libs.lora.train import LoraRecipe, random_adapters

    paths = {CALM: root / "calm-tone", FLOOD: root / "flood-tone"}
    random_adapters(base, {301: paths[CALM], 302: paths[FLOOD]}, LoraRecipe(rank=16), scale=0.5)
    app, lifespan = await start_registry(connections, f"lpx_bench_fair_real_{os.getpid()}")
    keys = {}
    async with admin_client(app) as admin:
        for tenant, path in paths.items():
            keys[tenant] = (await admin.post("/v1/tenants", json={"name": tenant})).raise_for_status().json()["api_key"]
            form = {"tenant": tenant, "adapter": ADAPTER, "base_model": BASE}
            number = (await admin.post("/v1/adapters", data=form, files=adapter_files(path))).json()["version"][
                "number"
            ]
            url = f"/v1/tenants/{tenant}/adapters/{ADAPTER}/versions/{number}/activate"
            (await admin.post(url, json={"actor": "bench", "reason": "bench_fairness_real"})).raise_for_status()
    return keys, lifespan


async def ask(url: str, key: str, tokens: int, at: float = 0.0) -> dict:
    await asyncio.sleep(at)
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=url, timeout=900, headers=headers) as http:
        try:
            return await one(http, ADAPTER, PROMPT, tokens, asyncio.Semaphore(1))
        except (RuntimeError, httpx.HTTPError) as exc:
            return {"error": str(exc)[:200]}


async def traffic(url: str, keys: dict[str, str], args, flooding: bool) -> dict:
    started = time.perf_counter()
    calm = [ask(url, keys[CALM], args.tokens, i * args.calm_every) for i in range(args.calm)]
    flood = [ask(url, keys[FLOOD], args.tokens) for _ in range(args.flood if flooding else 0)]
    results = await asyncio.gather(*calm, *flood)
    wall = time.perf_counter() - started
    return {"wall_s": wall, CALM: results[: len(calm)], FLOOD: results[len(calm) :]}


def pct(values: list[float], q: float) -> float | None:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else None


def summary(run: dict, references: dict[str, str]) -> dict:
    out = {"wall_s": run["wall_s"]}
    for tenant in (CALM, FLOOD):
        ok = [r for r in run[tenant] if "error" not in r]
        lat, ttft = [r["latency_s"] for r in ok], [r["ttft_s"] for r in ok]
        finished = [r["latency_s"] for r in ok]
        out[tenant] = {
            "sent": len(run[tenant]),
            "answered": len(ok),
            "right_adapter": sum(r["text"] == references[tenant] for r in ok),
            "p50_s": statistics.median(lat) if lat else None,
            "p95_s": pct(lat, 0.95),
            "ttft_p50_s": statistics.median(ttft) if ttft else None,
            "ttft_p95_s": pct(ttft, 0.95),
            "tokens": sum(r["tokens"] for r in ok),
            # a tenant's throughput: its tokens over the time until its last answer
            "tok_per_s": sum(r["tokens"] for r in ok) / max(finished) if finished else 0.0,
            "errors": sorted({r["error"] for r in run[tenant] if "error" in r}),
        }
    out["total_tok_per_s"] = (out[CALM]["tokens"] + out[FLOOD]["tokens"]) / run["wall_s"]
    return out


class Platform:
    """The local stack, the registry in-process, a gateway and a worker restarted when their settings
    change between runs."""

    def __init__(self, args) -> None:
        self.args = args
        self.base = fetch(BASE).path
        self.state = Path(tempfile.mkdtemp(prefix="lpx-bench-fair-real-"))
        os.chmod(self.state, 0o755)
        self.url_port, self.metrics_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.url_port}"
        self.gateway = self.worker = None
        self.gateway_env: dict | None = None
        self.worker_env: dict | None = None

    async def __aenter__(self):
        self.stack = Stack(StackConfig(dir=self.state / "stack"))
        self.stack.up()
        connections = ConnectionSettings.load(self.stack.env_file)
        self.keys, self.registry = await setup_tenants(connections, self.state / "adapters", self.base)
        return self

    async def __aexit__(self, *exc) -> None:
        stop(self.worker)
        stop(self.gateway, 30)
        await self.registry.__aexit__(None, None, None)
        self.stack.purge()

    async def configure(self, gateway_env: dict, worker_env: dict) -> None:
        if worker_env != self.worker_env:
            stop(self.worker)
            if self.gateway is not None:
                await wait_gone(self.url)
            extra = {"LPX_WORKER_LOG_LEVEL": "INFO", **worker_env}
            self.worker, self.worker_env = start_worker(self.stack.env_file, self.base, self.state, extra), worker_env
        if gateway_env != self.gateway_env:
            stop(self.gateway, 30)
            env = {
                **os.environ,
                "LPX_ENV_FILE": str(self.stack.env_file),
                "LPX_GATEWAY_PORT": str(self.url_port),
                "LPX_GATEWAY_HOST": "127.0.0.1",
                "LPX_GATEWAY_LOG_LEVEL": os.environ.get("LPX_GATEWAY_LOG_LEVEL", "WARNING"),
                "LPX_GATEWAY_METRICS_PORT": str(self.metrics_port),
                **gateway_env,
            }
            with open(self.state / "gateway.log", "a") as log:
                self.gateway = subprocess.Popen(
                    [sys.executable, "-m", "services.gateway"], env=env, stdout=log, stderr=subprocess.STDOUT
                )
            self.gateway_env = gateway_env
        await wait_ready(self.url, self.gateway, 1, timeout=600)

    async def references(self) -> dict[str, str]:
        """Each tenant's answer asked alone (after a warm-up that loads both adapters)."""
        refs = {}
        for tenant in (CALM, FLOOD, CALM, FLOOD):
            reply = await ask(self.url, self.keys[tenant], self.args.tokens)
            if "error" in reply:
                raise RuntimeError(f"{tenant}: {reply['error']}")
            refs[tenant] = reply["text"]
        if refs[CALM] == refs[FLOOD]:
            raise RuntimeError("both adapters give the same answer: the right-adapter check would prove nothing")
        return refs


SIM = {"LPX_WORKER_ENGINE": "sim", "LPX_WORKER_SIM_PROFILE": str(default_profile_path(BASE))}


async def measure(platform: Platform, args, engine_env: dict) -> dict:
    results = {}
    for name, flooding, gateway_env, worker_env in RUNS:
        await platform.configure(gateway_env, {**worker_env, **engine_env})
        refs = await platform.references()
        results[name] = summary(await traffic(platform.url, platform.keys, args, flooding), refs)
        calm = results[name][CALM]
        print(f"  measured: {name}{' (sim)' if engine_env else ''}: calm p50 {calm['p50_s']:.2f}s", flush=True)
    return results


async def main_async(args) -> dict:
    async with Platform(args) as platform:
        report = {"config": {k: str(v) for k, v in vars(args).items()}}
        report["results"] = await measure(platform, args, {})
        if args.compare_sim:
            report["sim"] = await measure(platform, args, SIM)
    return report


def render(report: dict, out: Path) -> None:
    r = report["results"]
    alone, fifo = r["calm alone"][CALM], r["FIFO"]

    def x(value, ref):
        return f"{value / ref:.2f}x" if value and ref else "-"

    head = f"{'':16}{'calm p50':>10}{'x alone':>9}{'calm p95':>10}{'x alone':>9}{'TTFT p50':>10}{'x alone':>9}"
    print(head + f"{'flood tok/s':>13}{'x FIFO':>8}{'all tok/s':>11}{'x FIFO':>8}{'right adapter':>15}")
    for name, run in r.items():
        c, f = run[CALM], run[FLOOD]
        right = f"{c['right_adapter'] + f['right_adapter']}/{c['sent'] + f['sent']}"
        cells = [
            f"{c['p50_s']:.2f}",
            x(c["p50_s"], alone["p50_s"]),
            f"{c['p95_s']:.2f}",
            x(c["p95_s"], alone["p95_s"]),
            f"{c['ttft_p50_s']:.2f}",
            x(c["ttft_p50_s"], alone["ttft_p50_s"]),
            f"{f['tok_per_s']:.1f}" if f["sent"] else "-",
            x(f["tok_per_s"], fifo[FLOOD]["tok_per_s"]) if f["sent"] else "-",
            f"{run['total_tok_per_s']:.1f}",
            x(run["total_tok_per_s"], fifo["total_tok_per_s"]),
            right,
        ]
        widths = [10, 9, 10, 9, 10, 9, 13, 8, 11, 8, 15]
        print(f"{name:16}" + "".join(f"{cell:>{w}}" for cell, w in zip(cells, widths, strict=True)))
    if "sim" in report:
        render_sim(r, report["sim"])
    out.mkdir(parents=True, exist_ok=True)
    (out / "fairness_real.json").write_text(json.dumps(report, indent=2))
    print(f"JSON: {out / 'fairness_real.json'}")


def markdown(report: dict) -> str:
    """The tables as the README and benchmarks/RESULTS.md show them."""
    r = report["results"]
    alone, fifo = r["calm alone"][CALM], r["FIFO"]

    def x(value, ref) -> str:
        return f"{value / ref:.2f}x" if value and ref else "-"

    lines = [
        "| | calm p50 | vs alone | calm p95 | vs alone | calm TTFT p50 | vs alone | flood tok/s | vs FIFO "
        "| all tok/s | vs FIFO | right adapter |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, run in r.items():
        c, f = run[CALM], run[FLOOD]
        flood = [f"{f['tok_per_s']:.1f}", x(f["tok_per_s"], fifo[FLOOD]["tok_per_s"])] if f["sent"] else ["-", "-"]
        cells = [
            f"{c['p50_s']:.2f} s",
            x(c["p50_s"], alone["p50_s"]),
            f"{c['p95_s']:.2f} s",
            x(c["p95_s"], alone["p95_s"]),
            f"{c['ttft_p50_s']:.2f} s",
            x(c["ttft_p50_s"], alone["ttft_p50_s"]),
            *flood,
            f"{run['total_tok_per_s']:.1f}",
            x(run["total_tok_per_s"], fifo["total_tok_per_s"]),
            f"{c['right_adapter'] + f['right_adapter']}/{c['sent'] + f['sent']}",
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    if "sim" in report:
        lines += ["", "simulated engine (shipped profile) / real engine:", ""]
        lines += ["| | calm p50 | flood tok/s | all tok/s |", "|---|---|---|---|"]
        for name, real in r.items():
            sim = report["sim"][name]
            flood = sim[FLOOD]["tok_per_s"] / real[FLOOD]["tok_per_s"] if real[FLOOD]["tok_per_s"] else None
            cells = [sim[CALM]["p50_s"] / real[CALM]["p50_s"], flood, sim["total_tok_per_s"] / real["total_tok_per_s"]]
            lines.append(f"| {name} | " + " | ".join(f"{c:.2f}x" if c else "-" for c in cells) + " |")
    return "\n".join(lines)


def render_sim(real: dict, sim: dict) -> None:
    """The simulated engine (following the shipped profile) against the real one, run by run."""
    print(f"\nsimulated engine / real engine ({default_profile_path(BASE).name}); target within 20%:")
    print(f"{'':16}{'calm p50':>10}{'flood tok/s':>13}{'all tok/s':>11}")
    for name in real:
        r, s = real[name], sim[name]
        cells = [
            s[CALM]["p50_s"] / r[CALM]["p50_s"],
            s[FLOOD]["tok_per_s"] / r[FLOOD]["tok_per_s"] if r[FLOOD]["tok_per_s"] else None,
            s["total_tok_per_s"] / r["total_tok_per_s"],
        ]
        print(
            f"{name:16}"
            + "".join(f"{c:>{w}.2f}" if c else f"{'-':>{w}}" for c, w in zip(cells, (10, 13, 11), strict=True))
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    parser.add_argument("--flood", type=int, default=96, help="flood requests, sent at once")
    parser.add_argument("--calm", type=int, default=12, help="calm requests")
    parser.add_argument("--calm-every", type=float, default=1.0, help="seconds between calm requests")
    parser.add_argument("--tokens", type=int, default=16, help="max_tokens per request")
    parser.add_argument(
        "--compare-sim",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run it again on the simulated engine following the shipped profile, and compare",
    )
    parser.add_argument("--no-record", action="store_true", help="do not append the run to benchmarks/RESULTS.md")
    args = parser.parse_args()
    ran_at = commit()
    report = asyncio.run(main_async(args))
    render(report, args.out)
    if not args.no_record:
        cfg = f"{args.flood} flood requests at once, {args.calm} calm ones every {args.calm_every:g} s"
        cfg += f", {args.tokens} tokens"
        print("recorded as:", record("bench_fairness_real", f"{cfg}\n\n{markdown(report)}", ran_at=ran_at))
    return 0


if __name__ == "__main__":
    sys.exit(main())
