"""Tenant fairness: one tenant floods the pool at 10x its fair share while four others send a steady
rate. Measured: the steady tenants' p50 latency against their latency with the flooder idle, with the
gateway's fair queuing (the default) and with FIFO (LPX_GATEWAY_FAIR_QUEUING=false), side by side; and
what the flooder still gets (work-conserving: the capacity nobody else uses).

Real parts: a local stack, the registry in-process (five tenants), one gateway process, `--workers`
worker processes on the simulated engine (`--capacity` sequences each at `--decode-tok-s`, `--tokens`
tokens per request: the pool's capacity in requests/s is printed). Open-loop traffic: each steady tenant
sends `--steady-rps`; the flooder sends 10x the fair share (pool capacity / tenants). The first
`--warmup` seconds are not measured. JSON in --out/fairness.json.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import time
import uuid
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import httpx

from benchmarks.registry_inproc import capacity_rps as pool_capacity_rps
from benchmarks.registry_inproc import sim_pool_parser, sim_profile, stack_with_tenants
from libs.fleet import Fleet, FleetSpec

BASE = "smollm2-135m"
STEADY = ("calm-b", "calm-c", "calm-d", "calm-e")
FLOOD = "flood-a"
RUNS = (("flooder idle", "true", False), ("fair queuing", "true", True), ("FIFO", "false", True))


async def send(http, key: str, tokens: int, tenant: str, samples: list, measured_from: float) -> None:
    body = {"model": BASE, "max_tokens": tokens, "messages": [{"role": "user", "content": "Hello"}]}
    started = time.monotonic()
    try:
        reply = await http.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})
        status = reply.status_code
    except httpx.HTTPError:
        status = 0
    if started >= measured_from:
        samples.append((tenant, status, time.monotonic() - started, time.monotonic()))


async def traffic(http, keys: dict[str, str], rates: dict[str, float], args) -> list:
    samples: list = []
    begin = time.monotonic()
    measured_from = begin + args.warmup
    end = measured_from + args.duration
    tasks = []

    async def tenant_loop(tenant: str, rate: float) -> None:
        n = 0
        while (at := begin + n / rate) < end:
            await asyncio.sleep(max(0.0, at - time.monotonic()))
            tasks.append(asyncio.create_task(send(http, keys[tenant], args.tokens, tenant, samples, measured_from)))
            n += 1

    await asyncio.gather(*(tenant_loop(t, r) for t, r in rates.items() if r > 0))
    await asyncio.gather(*tasks)
    return [(tenant, status, seconds, done <= end) for tenant, status, seconds, done in samples]


async def run(stack, state: Path, keys: dict[str, str], args, name: str, fair: str, flooding: bool) -> dict:
    spec = FleetSpec(
        pool=f"fair-{uuid.uuid4().hex[:6]}",
        capacity=args.capacity,
        decode_tok_s=args.decode_tok_s,
        sim_profile=sim_profile(args),
    )
    fleet = Fleet(env_file=stack.env_file, state=state / name.replace(" ", "-"), spec=spec)
    url = fleet.start_gateway(
        "gw-0", {"LPX_GATEWAY_FAIR_QUEUING": fair, "LPX_GATEWAY_REQUEST_TIMEOUT_S": str(args.deadline)}
    )
    for i in range(args.workers):
        fleet.start_worker(f"fair-{i}")
    capacity_rps = pool_capacity_rps(args)
    rates = {t: args.steady_rps for t in STEADY} | {FLOOD: 10 * capacity_rps / 5 if flooding else 0.0}
    try:
        await fleet.wait_ready(args.workers)
        limits = httpx.Limits(max_connections=4000, max_keepalive_connections=200)
        async with httpx.AsyncClient(base_url=url, timeout=args.deadline + 60, limits=limits) as http:
            samples = await traffic(http, keys, rates, args)
    finally:
        fleet.stop()
    return summarise(samples, args.duration, capacity_rps, rates)


def summarise(samples: list, duration: float, capacity_rps: float, rates: dict[str, float]) -> dict:
    latencies, statuses = defaultdict(list), defaultdict(lambda: defaultdict(int))
    in_window, total_in_window = 0, 0
    for tenant, status, seconds, within in samples:
        statuses[tenant][str(status)] += 1
        if status == 200:
            latencies[tenant].append(seconds)
            in_window += tenant == FLOOD and within
            total_in_window += within
    steady = [s for t in STEADY for s in latencies[t]]
    return {
        "capacity_rps": capacity_rps,
        "rates": rates,
        "steady_p50_s": statistics.median(steady) if steady else None,
        "steady_answered_share": len(steady) / max(1, sum(sum(statuses[t].values()) for t in STEADY)),
        "flood_answered_rps": in_window / duration,  # answers the flooder got within the measured window
        "total_answered_rps": total_in_window / duration,  # the pool's delivered throughput (work-conserving?)
        "flood_p50_s": statistics.median(latencies[FLOOD]) if latencies[FLOOD] else None,
        "statuses": {t: dict(v) for t, v in statuses.items()},
    }


async def main_async(args) -> dict:
    async with stack_with_tenants("fairness", [*STEADY, FLOOD]) as (stack, state, keys):
        results = {}
        for name, fair, flooding in RUNS:
            results[name] = await run(stack, state, keys, args, name, fair, flooding)
            print(f"  measured: {name}", flush=True)
    return {"config": vars(args) | {"out": str(args.out)}, "results": results}


def render(report: dict, out: Path) -> None:
    cfg, results = report["config"], report["results"]
    idle = results["flooder idle"]
    print(
        f"\npool: {cfg['workers']} simulated workers x {cfg['capacity']} sequences, {idle['capacity_rps']:.1f} req/s; "
        f"4 steady tenants x {cfg['steady_rps']:g} req/s; flooder at 10x its fair share "
        f"({results['fair queuing']['rates'][FLOOD]:.1f} req/s); {cfg['duration']:g} s measured"
    )
    print(f"{'':28}{'steady p50 s':>14}{'x idle':>9}{'steady ok':>11}{'flood ok req/s':>16}{'all ok req/s':>14}")
    for name, r in results.items():
        ratio = r["steady_p50_s"] / idle["steady_p50_s"] if r["steady_p50_s"] and idle["steady_p50_s"] else None
        cells = [
            f"{r['steady_p50_s']:.2f}" if r["steady_p50_s"] else "-",
            f"{ratio:.2f}x" if ratio else "-",
            f"{r['steady_answered_share']:.0%}",
            f"{r['flood_answered_rps']:.1f}",
            f"{r['total_answered_rps']:.1f}",
        ]
        print(f"{name:28}{cells[0]:>14}{cells[1]:>9}{cells[2]:>11}{cells[3]:>16}{cells[4]:>14}")
    spare = idle["capacity_rps"] - 4 * cfg["steady_rps"]
    print(f"capacity the steady tenants leave: {spare:.1f} req/s (what a work-conserving scheduler gives the flooder)")
    out.mkdir(parents=True, exist_ok=True)
    (out / "fairness.json").write_text(json.dumps(report, indent=2))
    print(f"JSON: {out / 'fairness.json'}")


def main() -> int:
    parser = sim_pool_parser(__doc__)
    parser.add_argument(
        "--steady-rps",
        type=float,
        default=None,
        help="requests/s of each steady tenant (default: the four together use 40%% of the pool's capacity)",
    )
    parser.add_argument("--deadline", type=float, default=30.0, help="request deadline, seconds")
    args = parser.parse_args()
    if args.steady_rps is None:
        args.steady_rps = round(0.4 * pool_capacity_rps(args) / len(STEADY), 2)
    render(asyncio.run(main_async(args)), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
