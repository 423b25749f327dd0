"""Overload: a burst the pool cannot finish before the deadline, with and without early refusal.

Real parts: a local stack, the registry in-process (one tenant), one gateway process, `--workers`
worker processes on the simulated engine (the real worker code; `--capacity` sequences each at
`--decode-tok-s`). After a warm-up (the gateway measures the time per request), `--burst` chat requests
arrive at once, each asking `--tokens` tokens with a `--deadline` s deadline. Without early refusal the
gateway accepts them all and those that cannot finish end in 504 after the whole deadline; with it
(the default) they get 503 + Retry-After at once. Printed side by side: answered, refused early (and
how fast), 504 (and after how long), p50 latency of the answered. JSON in --out/overload.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import httpx

from benchmarks.registry_inproc import stack_with_tenants
from libs.engine.profile import default_profile_path
from libs.fleet import Fleet, FleetSpec

BASE = "smollm2-135m"
MODES = {"early refusal": "true", "accept all": "false"}


async def one(http: httpx.AsyncClient, key: str, tokens: int) -> tuple[int, str, float]:
    body = {"model": BASE, "max_tokens": tokens, "messages": [{"role": "user", "content": "Tell me a story."}]}
    started = time.monotonic()
    try:
        reply = await http.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})
        code = "" if reply.status_code == 200 else reply.json()["error"]["code"]
        return reply.status_code, code, time.monotonic() - started
    except httpx.HTTPError as exc:
        return 0, type(exc).__name__, time.monotonic() - started


async def run_mode(stack, state: Path, key: str, args, mode: str) -> dict:
    spec = FleetSpec(
        pool=f"overload-{uuid.uuid4().hex[:6]}",
        capacity=args.capacity,
        decode_tok_s=args.decode_tok_s,
        sim_profile=None if args.sim_profile == "none" else Path(args.sim_profile),
    )
    fleet = Fleet(env_file=stack.env_file, state=state / mode.replace(" ", "-"), spec=spec)
    url = fleet.start_gateway(
        "gw-0", {"LPX_GATEWAY_EARLY_REFUSAL": MODES[mode], "LPX_GATEWAY_REQUEST_TIMEOUT_S": str(args.deadline)}
    )
    for i in range(args.workers):
        fleet.start_worker(f"ovl-{i}")
    try:
        await fleet.wait_ready(args.workers)
        limits = httpx.Limits(max_connections=args.burst + 10, max_keepalive_connections=args.burst + 10)
        async with httpx.AsyncClient(base_url=url, timeout=args.deadline + 60, limits=limits) as http:
            await asyncio.gather(*(one(http, key, args.tokens) for _ in range(args.warmup)))  # measured service time
            started = time.monotonic()
            outcomes = await asyncio.gather(*(one(http, key, args.tokens) for _ in range(args.burst)))
            wall = time.monotonic() - started
    finally:
        fleet.stop()
    return summarise(outcomes, wall)


def summarise(outcomes: list[tuple[int, str, float]], wall: float) -> dict:
    def times(pred) -> list[float]:
        return [t for status, code, t in outcomes if pred(status, code)]

    answered = times(lambda s, c: s == 200)
    early = times(lambda s, c: s == 503 and c == "pool_overloaded")
    late = times(lambda s, c: s == 504)
    return {
        "sent": len(outcomes),
        "answered": len(answered),
        "refused_early": len(early),
        "deadline_504": len(late),
        "other": dict(Counter(f"{s} {c}" for s, c, _ in outcomes if s not in (200, 504) and c != "pool_overloaded")),
        "answered_p50_s": statistics.median(answered) if answered else None,
        "refusal_mean_s": statistics.fmean(early) if early else None,
        "deadline_mean_s": statistics.fmean(late) if late else None,
        "caller_seconds_lost": sum(early) + sum(late),  # waiting that ended without an answer
        "wall_s": wall,
    }


async def main_async(args) -> dict:
    async with stack_with_tenants("overload", ["burst"]) as (stack, state, keys):
        results = {}
        for mode in MODES:
            results[mode] = await run_mode(stack, state, keys["burst"], args, mode)
            print(f"  measured: {mode}", flush=True)
    return {"config": vars(args) | {"out": str(args.out)}, "results": results}


def render(report: dict, out: Path) -> None:
    cfg, results = report["config"], report["results"]
    rate = f"{cfg['decode_tok_s']:g} tok/s" if cfg["sim_profile"] == "none" else Path(cfg["sim_profile"]).name
    print(
        f"\nburst of {cfg['burst']} chat requests, {cfg['workers']} simulated workers x {cfg['capacity']} sequences at "
        f"{rate}, {cfg['tokens']} tokens each, {cfg['deadline']:g} s deadline"
    )
    rows = [
        ("answered", "answered", "{:.0f}"),
        ("refused_early", "503 at once", "{:.0f}"),
        ("refusal_mean_s", "  after (mean s)", "{:.2f}"),
        ("deadline_504", "504 at deadline", "{:.0f}"),
        ("deadline_mean_s", "  after (mean s)", "{:.2f}"),
        ("answered_p50_s", "answered p50 s", "{:.2f}"),
        ("caller_seconds_lost", "caller s without answer", "{:.0f}"),
    ]
    modes = list(results)
    print(f"{'':26}" + "".join(f"{m:>16}" for m in modes))
    for key, label, fmt in rows:
        cells = [results[m][key] for m in modes]
        print(f"{label:26}" + "".join(f"{'-' if v is None else fmt.format(v):>16}" for v in cells))
    out.mkdir(parents=True, exist_ok=True)
    (out / "overload.json").write_text(json.dumps(report, indent=2))
    print(f"JSON: {out / 'overload.json'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--capacity", type=int, default=16, help="sequences per worker")
    parser.add_argument("--decode-tok-s", type=float, default=16.0, help="simulated decode rate per sequence")
    parser.add_argument("--tokens", type=int, default=64, help="max_tokens per request")
    parser.add_argument("--burst", type=int, default=400, help="requests arriving at once")
    parser.add_argument("--warmup", type=int, default=16, help="requests before the burst (the gateway measures)")
    parser.add_argument("--deadline", type=float, default=30.0, help="request deadline, seconds")
    parser.add_argument(
        "--sim-profile",
        default=str(default_profile_path("smollm2-135m")),
        help="engine profile the simulated workers follow ('none': a fixed --decode-tok-s per sequence)",
    )
    args = parser.parse_args()
    render(asyncio.run(main_async(args)), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
