"""SLO tiers: interactive time to first token while a batch job keeps a backlog of 10x the pool's capacity.

Interactive traffic (streaming HTTP chat from two tenants at a steady rate) is measured three ways:
alone; beside a batch tenant whose async NATS submissions keep `--backlog-x` times the pool's capacity
queued (topped up as results come back), with the gateway's tiers (the default: interactive requests
are admitted ahead of batch work once the pool is full); and the same backlog with FIFO
(LPX_GATEWAY_FAIR_QUEUING=false). Reported: interactive TTFT p50/p95 and its ratio to the idle run,
and the batch results per second (the capacity interactive traffic leaves goes to the batch job).

Real parts: a local stack, the registry in-process, one gateway process, `--workers` worker processes
on the simulated engine (`--capacity` sequences each at `--decode-tok-s`, `--tokens` per request).
JSON in --out/slo.json.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import httpx

from benchmarks.registry_inproc import capacity_rps, sim_pool_parser, sim_profile, stack_with_tenants
from libs.client import LoraplexClient
from libs.contracts import subjects
from libs.fleet import Fleet, FleetSpec
from libs.settings import ConnectionSettings

BASE = "smollm2-135m"
INTERACTIVE = ("chat-a", "chat-b")
BATCH = "batch-z"
RUNS = (("no backlog", "true", False), ("backlog, tiers", "true", True), ("backlog, FIFO", "false", True))


async def first_token_s(http, key: str, tokens: int) -> tuple[int, float | None]:
    """(status, seconds to the first content delta) of one streaming chat request."""
    body = {"model": BASE, "max_tokens": tokens, "stream": True, "messages": [{"role": "user", "content": "Hello"}]}
    started = time.monotonic()
    try:
        async with http.stream(
            "POST", "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
        ) as reply:
            if reply.status_code != 200:
                return reply.status_code, None
            ttft = None
            async for line in reply.aiter_lines():
                # the first chunk is the role with empty content: the first token is the first text
                if ttft is None and line.startswith("data: {") and '"content":"' in line and '"content":""' not in line:
                    ttft = time.monotonic() - started
            return 200, ttft
    except httpx.HTTPError:
        return 0, None


class Backlog:
    """Keeps `size` async submissions of the batch tenant outstanding; counts their results."""

    def __init__(self, lpx: LoraplexClient, size: int, tokens: int) -> None:
        self.lpx, self.size, self.tokens = lpx, size, tokens
        self.outstanding: set[str] = set()
        self.done: list[tuple[float, bool]] = []  # (when, ok)

    async def on_result(self, msg) -> None:
        rid = msg.subject.rsplit(".", 1)[-1]
        if rid in self.outstanding:
            self.outstanding.discard(rid)
            self.done.append((time.monotonic(), b'"ok":true' in msg.data))

    async def keep_full(self, until: float) -> None:
        while time.monotonic() < until:
            missing = self.size - len(self.outstanding)
            for _ in range(max(0, missing)):
                rid = await self.lpx.submit(
                    BASE, messages=[{"role": "user", "content": "Summarise"}], max_tokens=self.tokens, timeout_s=3600
                )
                self.outstanding.add(rid)
            await asyncio.sleep(0.2)


async def interactive_traffic(http, keys: dict[str, str], args, begin: float) -> list[tuple[int, float | None]]:
    measured_from, end = begin + args.warmup, begin + args.warmup + args.duration
    samples, tasks = [], []

    async def one(key: str) -> None:
        sent_at = time.monotonic()
        status, ttft = await first_token_s(http, key, args.tokens)
        if sent_at >= measured_from:
            samples.append((status, ttft))

    async def tenant_loop(tenant: str) -> None:
        n = 0
        while (at := begin + n / args.interactive_rps) < end:
            await asyncio.sleep(max(0.0, at - time.monotonic()))
            tasks.append(asyncio.create_task(one(keys[tenant])))
            n += 1

    await asyncio.gather(*(tenant_loop(t) for t in INTERACTIVE))
    await asyncio.gather(*tasks)
    return samples


async def run(stack, state: Path, keys: dict[str, str], args, name: str, fair: str, backlog_on: bool) -> dict:
    spec = FleetSpec(
        pool=f"slo-{uuid.uuid4().hex[:6]}",
        capacity=args.capacity,
        decode_tok_s=args.decode_tok_s,
        sim_profile=sim_profile(args),
    )
    fleet = Fleet(env_file=stack.env_file, state=state / name.replace(" ", "-").replace(",", ""), spec=spec)
    url = fleet.start_gateway(
        "gw-0", {"LPX_GATEWAY_FAIR_QUEUING": fair, "LPX_GATEWAY_SUBMIT_CONCURRENCY": str(4 * args.backlog_size)}
    )
    for i in range(args.workers):
        fleet.start_worker(f"slo-{i}")
    conn = ConnectionSettings.load(stack.env_file)
    nats_url, operator = conn.nats_url, conn.nats_auth("admin")  # the benchmark watches every result
    try:
        await fleet.wait_ready(args.workers)
        async with (
            LoraplexClient(
                nats_url, api_key=keys[BATCH], user=operator.get("user"), password=operator.get("password")
            ) as lpx,
            httpx.AsyncClient(base_url=url, timeout=600, limits=httpx.Limits(max_connections=1000)) as http,
        ):
            backlog = Backlog(lpx, args.backlog_size, args.tokens)
            sub = await lpx.nc.subscribe(subjects.tenant_results_filter(lpx.tenant), cb=backlog.on_result)
            begin = time.monotonic()
            end = begin + args.warmup + args.duration
            filler = asyncio.create_task(backlog.keep_full(end)) if backlog_on else None
            samples = await interactive_traffic(http, keys, args, begin)
            if filler is not None:
                await filler
            await sub.unsubscribe()
    finally:
        fleet.stop()
    measured = [t for t in backlog.done if begin + args.warmup <= t[0] <= end]
    return summarise(samples, measured, args.duration)


def summarise(samples: list, batch_done: list, duration: float) -> dict:
    ttfts = sorted(t for status, t in samples if status == 200 and t is not None)
    return {
        "interactive_sent": len(samples),
        "interactive_ok": len(ttfts),
        "ttft_p50_s": statistics.median(ttfts) if ttfts else None,
        "ttft_p95_s": ttfts[int(0.95 * (len(ttfts) - 1))] if ttfts else None,
        "batch_results_per_s": len(batch_done) / duration,
        "batch_ok_share": sum(ok for _, ok in batch_done) / len(batch_done) if batch_done else None,
    }


async def main_async(args) -> dict:
    async with stack_with_tenants("slo", [*INTERACTIVE, BATCH]) as (stack, state, keys):
        results = {}
        for name, fair, backlog_on in RUNS:
            results[name] = await run(stack, state, keys, args, name, fair, backlog_on)
            print(f"  measured: {name}", flush=True)
    return {"config": vars(args) | {"out": str(args.out)}, "results": results}


def render(report: dict, out: Path) -> None:
    cfg, results = report["config"], report["results"]
    idle = results["no backlog"]
    print(
        f"\npool: {cfg['workers']} simulated workers x {cfg['capacity']} sequences ({cfg['capacity_rps']:.1f} req/s); "
        f"interactive: {len(INTERACTIVE)} tenants x {cfg['interactive_rps']:g} req/s streaming; batch backlog kept at "
        f"{cfg['backlog_size']} submissions ({cfg['backlog_x']:g}x the pool's capacity); {cfg['duration']:g} s measured"
    )
    print(f"{'':18}{'TTFT p50 s':>12}{'x idle':>9}{'TTFT p95 s':>12}{'interactive ok':>16}{'batch req/s':>13}")
    for name, r in results.items():
        p50, base = r["ttft_p50_s"], idle["ttft_p50_s"]
        cells = [
            f"{p50:.3f}" if p50 else "-",
            f"{p50 / base:.2f}x" if p50 and base else "-",
            f"{r['ttft_p95_s']:.3f}" if r["ttft_p95_s"] else "-",
            f"{r['interactive_ok']}/{r['interactive_sent']}",
            f"{r['batch_results_per_s']:.1f}",
        ]
        print(f"{name:18}{cells[0]:>12}{cells[1]:>9}{cells[2]:>12}{cells[3]:>16}{cells[4]:>13}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "slo.json").write_text(json.dumps(report, indent=2))
    print(f"JSON: {out / 'slo.json'}")


def main() -> int:
    parser = sim_pool_parser(__doc__)
    parser.add_argument(
        "--interactive-rps",
        type=float,
        default=None,
        help="requests/s of each interactive tenant (default: together 25%% of the pool's capacity)",
    )
    parser.add_argument("--backlog-x", type=float, default=10.0, help="batch backlog in multiples of the capacity")
    args = parser.parse_args()
    args.capacity_rps = capacity_rps(args)
    if args.interactive_rps is None:
        args.interactive_rps = round(0.25 * args.capacity_rps / len(INTERACTIVE), 2)
    args.backlog_size = int(args.backlog_x * args.workers * args.capacity)
    render(asyncio.run(main_async(args)), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
