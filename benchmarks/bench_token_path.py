"""What loraplex's streaming path costs per token at GPU token rates: the gateway, NATS and the worker
around an engine that produces tokens as fast as a GPU does, with the engine's own cost taken out.

On this 2-core machine the real engine makes ~160 tokens/s and the path's cost hides in its noise
(benchmarks/bench_vs_vllm.py). A GPU makes thousands a second, and then every message per token counts.
So the engine here is the simulated one on shared steps (as vLLM's: every running sequence gets its
token in the same step; `--step-ms` per step, prompts free), while everything else is real: the local
stack, and the registry, the gateway and the worker as their own processes, streamed chat requests
over HTTP. Alternated round after round on one machine:
  batched:   the worker's default: one TokenBatch message per engine step per gateway
  per token: LPX_WORKER_TOKEN_BATCHES=false: one message per token of each request (before TokenBatch)
Printed per form: tokens/s, TTFT p50, CPU seconds per 1k tokens by process (gateway, worker, NATS, the
registry, the benchmark client), token messages the gateway received per 1k tokens; medians over
rounds with their spread. JSON and a plot in --out; the summary appended to benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from benchmarks import cpu_account
from benchmarks.bench_gateway import free_port, wait_ready
from benchmarks.bench_vs_vllm import BASE, POOL, run, start_gateway, stop, wait_gone
from benchmarks.registry_inproc import admin_http, registry_process
from benchmarks.results_log import commit
from libs.stack import Stack, StackConfig

FORMS = {"batched": "true", "per token": "false"}  # LPX_WORKER_TOKEN_BATCHES
KINDS = ("gateway", "worker", "nats", "registry", "bench client")  # the path: the first three
_MESSAGES = re.compile(r'^lpx_gateway_token_messages_total\{form="(\w+)".*\}\s+([0-9.e+]+)$')


def flat_profile(path: Path, step_s: float) -> Path:
    """An engine profile whose step costs `step_s` whatever the batch, prompts nearly free."""
    doc = {"base_model": BASE, "device": "sim", "decode_step_s": {"1": step_s, "256": step_s}, "prefill_tok_s": 1e6}
    path.write_text(json.dumps(doc))
    return path


async def token_messages(port: int) -> float:
    async with httpx.AsyncClient(timeout=10) as http:
        text = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
    return sum(float(m.group(2)) for line in text.splitlines() if (m := _MESSAGES.match(line)))


class TokenPathBench:
    """The stack, the registry, one gateway; a simulated-engine worker started per form."""

    def __init__(self, args) -> None:
        self.args = args
        self.state = Path(tempfile.mkdtemp(prefix="lpx-bench-token-path-"))
        self.gw_port, self.metrics_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.gw_port}"

    async def __aenter__(self):
        self.stack = Stack(StackConfig(dir=self.state / "stack"))
        self.stack.up()
        self.registry = contextlib.AsyncExitStack()  # its own process, as deployed (see bench_vs_vllm)
        url = await self.registry.enter_async_context(
            registry_process(self.stack.env_file, "lpx_bench_token_path", self.state / "registry.log")
        )
        async with admin_http(url) as admin:
            reply = await admin.post("/v1/tenants", json={"name": "bench"})
            self.key = reply.raise_for_status().json()["api_key"]
        self.gateway = start_gateway(self.stack.env_file, self.gw_port, self.metrics_port, self.state / "gateway.log")
        self.profile = flat_profile(self.state / "flat-profile.json", self.args.step_ms / 1000)
        return self

    async def __aexit__(self, *exc) -> None:
        stop(self.gateway, 30)
        await self.registry.aclose()
        self.stack.purge()

    async def form_run(self, form: str) -> dict:
        env = {
            **os.environ,
            "LPX_ENV_FILE": str(self.stack.env_file),
            "LPX_WORKER_WORKER_ID": "bench-tokens",
            "LPX_WORKER_POOL": POOL,
            "LPX_WORKER_BASE_MODEL": BASE,
            "LPX_WORKER_ENGINE": "sim",
            "LPX_WORKER_SIM_PROFILE": str(self.profile),
            "LPX_WORKER_CAPACITY": str(self.args.concurrency),
            "LPX_WORKER_MAX_NUM_SEQS": str(self.args.concurrency),
            "LPX_WORKER_LOG_LEVEL": "WARNING",
            "LPX_WORKER_TOKEN_BATCHES": FORMS[form],
        }
        worker = _spawn(["-m", "services.worker"], env, self.state / "worker.log")
        try:
            await wait_ready(self.url, self.gateway, 1, timeout=120)
            await run(self.url, self.key, [BASE], self.args.concurrency, self.args)  # warm
            messages_before, cpu_before = await token_messages(self.metrics_port), cpu_account.snapshot()
            result = await run(self.url, self.key, [BASE], self.args.requests, self.args)
            result["cpu_s"] = cpu_account.spent(cpu_before, cpu_account.snapshot())
            result["token_messages"] = await token_messages(self.metrics_port) - messages_before
        finally:
            stop(worker)
            await wait_gone(self.url)
        result.pop("samples")
        return result


def _spawn(argv: list[str], env: dict, log: Path) -> subprocess.Popen:
    with open(log, "a") as out:
        return subprocess.Popen([sys.executable, *argv], env=env, stdout=out, stderr=subprocess.STDOUT)


def per_1k(run_: dict, value: float) -> float:
    return 1000 * value / max(1, run_["tokens"])


def summary(rounds: list[dict[str, dict]]) -> dict:
    def spread(values: list[float]) -> dict:
        return {"median": statistics.median(values), "min": min(values), "max": max(values)}

    out = {}
    for form in FORMS:
        runs = [r[form] for r in rounds]
        row = {
            "tok_per_s": spread([r["tok_per_s"] for r in runs]),
            "ttft_p50_s": spread([r["ttft_p50_s"] for r in runs]),
            "messages_per_1k": spread([per_1k(r, r["token_messages"]) for r in runs]),
        }
        for kind in KINDS:
            row[f"cpu {kind}"] = spread([per_1k(r, r["cpu_s"].get(kind, 0.0)) for r in runs])
        row["cpu path"] = spread([per_1k(r, sum(r["cpu_s"].get(k, 0.0) for k in KINDS[:3])) for r in runs])
        out[form] = row
    return out


def markdown(rep: dict) -> str:
    a = rep["args"]
    head = (
        f"Streaming path at GPU token rates: simulated engine on shared steps of {a['step_ms']} ms, "
        f"{a['requests']} streamed chat requests per run, {a['concurrency']} concurrent, {a['tokens']} tokens, "
        f"{a['rounds']} rounds alternating {' / '.join(FORMS)} (median [min-max])"
    )
    cols = ["tok_per_s", "ttft_p50_s", "messages_per_1k", *(f"cpu {k}" for k in KINDS), "cpu path"]
    names = {"tok_per_s": "tok/s", "ttft_p50_s": "TTFT p50 (s)", "messages_per_1k": "token messages / 1k tok"}
    lines = [
        "| form | " + " | ".join(names.get(c, c.replace("cpu ", "CPU-s/1k tok: ")) for c in cols) + " |",
        "|---" * (len(cols) + 1) + "|",
    ]
    for form, row in rep["summary"].items():
        cells = [f"{_num(row[c]['median'])} [{_num(row[c]['min'])}-{_num(row[c]['max'])}]" for c in cols]
        lines.append(f"| {form} | " + " | ".join(cells) + " |")
    b, p = rep["summary"]["batched"], rep["summary"]["per token"]
    ratio = b["cpu path"]["median"] / max(1e-9, p["cpu path"]["median"])
    tail = f"CPU of gateway + worker + NATS per token, batched / per token: {ratio:.2f}x (medians)."
    return "\n\n".join([head, "\n".join(lines), tail])


def _num(value: float) -> str:
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"


def plot(rep: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    forms = list(rep["summary"])
    bottom = [0.0] * len(forms)
    for kind in KINDS:
        values = [rep["summary"][f][f"cpu {kind}"]["median"] for f in forms]
        ax.bar(forms, values, bottom=bottom, label=kind)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_ylabel("CPU seconds per 1k streamed tokens")
    ax.set_title(f"Streaming path per token (engine steps of {rep['args']['step_ms']} ms, simulated)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)


async def main_async(args) -> dict:
    rounds = []
    async with TokenPathBench(args) as bench:
        for i in range(args.rounds):
            turn = {}
            for form in FORMS:
                turn[form] = await bench.form_run(form)
                r = turn[form]
                cpu = json.dumps({k: round(v, 2) for k, v in r["cpu_s"].items()})
                print(
                    f"  round {i + 1} {form:<10} {r['tok_per_s']:7.0f} tok/s  TTFT p50 {r['ttft_p50_s']:.3f}s  "
                    f"messages {r['token_messages']:.0f}  CPU {cpu}",
                    flush=True,
                )
            rounds.append(turn)
    keys = ("requests", "concurrency", "tokens", "rounds", "step_ms")
    return {
        "args": {k: getattr(args, k) for k in keys},
        "commit": args.commit,
        "rounds": rounds,
        "summary": summary(rounds),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    parser.add_argument("--requests", type=int, default=128, help="requests per run")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=128, help="max_tokens per request")
    parser.add_argument(
        "--step-ms", type=float, default=10.0, help="simulated engine step (10 ms: 100 tok/s a sequence)"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-record", action="store_true", help="do not append to benchmarks/RESULTS.md")
    args = parser.parse_args()
    args.commit = commit()
    rep = asyncio.run(main_async(args))
    body = markdown(rep)
    print(body)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "token_path.json").write_text(json.dumps(rep, indent=2))
    plot(rep, args.out / "token_path.png")
    print(f"wrote {args.out / 'token_path.json'} and {args.out / 'token_path.png'}")
    if not args.no_record:
        from benchmarks.results_log import record

        print("recorded in benchmarks/RESULTS.md as:", record("bench_token_path", body, ran_at=args.commit))
    return 0


if __name__ == "__main__":
    sys.exit(main())
