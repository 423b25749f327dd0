"""Fleet benchmark: many gateways and simulated workers as one system, measured against the routing
simulator's prediction for the same configuration.

Real parts: a local stack (NATS, PostgreSQL, S3), the registry in-process with a tenant and `--adapters`
small rank-16 adapters on SmolLM2's real shapes (first layer's q_proj) pushed through it and activated,
`--gateways` gateway processes and `--workers` worker processes on the simulated engine
(LPX_WORKER_ENGINE=sim: the real worker code, tiers, downloads, digest checks, slots, heartbeats; no
model). Traffic: the simulator's own seeded stream (Poisson arrivals, Zipf popularity with the top
`--top-k` adapters carrying `--top-share`), sent as async NATS submissions spread over the gateways'
shared submission consumer; the first `--warmup` seconds are not measured.

Per routing policy (a fresh fleet each, empty caches): adapter loads per 1k requests (engine host-cache
loads + cold loads from disk or S3), slot hit rate, max/mean in-flight load at assignment, bound
violations (load after assignment > ceil(c x (total + 1) / n), reconstructed from every request's
assignment and result times: at the gateway's choice, and at the worker's taking it, which is where the
workers' own check of the bound holds it), messages passed on over the bound, p50/p99 latency; beside
each, the simulator's prediction for the same configuration and the ratio measured / predicted (its
placed scenario, placing as the workers do: the demand seen so far, then the other active adapters, onto
the disk tier, on LPX_WORKER_PLACEMENT_POSITIONS ring positions; cold loads come from disk or S3, and the
S3 column counts those from the object store alone). The simulator has no model of why the workers
pass requests on over the bound (the gateways see each other's choices late); a second prediction takes
the share measured as given, passed on as they fill a worker to the bound, to any worker under it. Then a
fault run: mid-run one gateway and a quarter of the workers are SIGKILLed; every submission must be
answered exactly once. JSON and a plot in --out.

Policies: `bounded_load` (the default: gateways' bound + the workers' own check), `bounded_load_approx`
(the gateways' bound alone: the workers pass nothing on), and the baselines (`random`, ...: the workers'
check off too, so a baseline is what it says).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from pydantic_settings import BaseSettings, SettingsConfigDict

from benchmarks.fleet_analysis import Sample, summarise
from benchmarks.fleet_report import render
from benchmarks.registry_inproc import adapter_files, admin_http, registry_process
from libs.contracts import subjects
from libs.fleet import Fleet, FleetSpec
from libs.models.bootstrap import fetch
from libs.routing import DEFAULT_BALANCE_FACTOR
from libs.settings import ConnectionSettings
from libs.simulator.config import SimConfig
from libs.simulator.runner import run_comparison
from libs.simulator.traffic import make_traffic
from libs.stack import Stack, StackConfig
from services.worker.settings import WorkerSettings

BASE = "smollm2-135m"
TENANT = "fleet"


# --- setup ------------------------------------------------------------------------------------------
def make_adapters(base: Path, root: Path, count: int) -> list[Path]:
    from libs.lora.train import LoraRecipe, random_adapters

    outs = {1000 + i: root / f"a{i:04d}" for i in range(count)}
    random_adapters(base, outs, LoraRecipe(rank=16, target_modules=("q_proj",), layers=(0,)), scale=0.05)
    return list(outs.values())


async def setup_registry(url: str, adapters: list[Path]) -> tuple[str, dict[str, str]]:
    """On the registry at `url`: a tenant, every adapter pushed and activated (admin override: the eval
    gate is not what this benchmark measures). Returns (api key, alias -> digest)."""
    slots = asyncio.Semaphore(4)
    async with admin_http(url) as admin:
        key = (await admin.post("/v1/tenants", json={"name": TENANT})).raise_for_status().json()["api_key"]

        async def push(i: int, path: Path) -> tuple[str, str]:
            alias = f"a{i:04d}"
            async with slots:
                reply = await admin.post(
                    "/v1/adapters",
                    files=adapter_files(path),
                    data={"tenant": TENANT, "adapter": alias, "base_model": BASE},
                )
                version = reply.raise_for_status().json()["version"]
                url = f"/v1/tenants/{TENANT}/adapters/{alias}/versions/{version['number']}/activate"
                (await admin.post(url, json={"actor": "bench", "reason": "bench_fleet"})).raise_for_status()
            return alias, version["digest"]

        aliases = dict(await asyncio.gather(*(push(i, p) for i, p in enumerate(adapters))))
    return key, aliases


# --- traffic ----------------------------------------------------------------------------------------
async def drive(client, key: str, stream, aliases: list[str], args, on_tick=None) -> list[Sample]:
    """Send the stream at its arrival times (async submissions); gather every result."""
    samples, waits = [], []
    started = time.monotonic()

    async def one(sample: Sample) -> None:
        sent = time.monotonic()
        rid = await client.submit(
            sample.alias,
            messages=[{"role": "user", "content": "hello"}],
            max_tokens=args.tokens,
            api_key=key,
            timeout_s=300,
        )
        sample.result = await client.result(rid, timeout=300)
        sample.latency_s = time.monotonic() - sent
        sample.rid = rid

    for at, rank in zip(stream.arrival_s, stream.adapter_rank, strict=True):
        delay = at - (time.monotonic() - started)
        if delay > 0:
            await asyncio.sleep(delay)
        if on_tick is not None:
            on_tick(at)
        sample = Sample(aliases[rank], measured=at >= args.warmup)
        samples.append(sample)
        waits.append(asyncio.create_task(one(sample)))
    await asyncio.gather(*waits)
    return samples


class _WorkersPlacement(BaseSettings):
    """The one worker setting the simulator must share with the workers (they inherit this environment)."""

    model_config = SettingsConfigDict(env_prefix="LPX_WORKER_", extra="ignore")
    placement_positions: int = WorkerSettings.model_fields["placement_positions"].default


def placement_positions() -> int:
    """The workers' LPX_WORKER_PLACEMENT_POSITIONS, else its default."""
    return _WorkersPlacement().placement_positions


def predict(args, policy: str, spec: FleetSpec, handoff_share: float) -> tuple[dict, dict]:
    """The routing simulator on the same configuration and the same seeded traffic: its steady scenario
    (no placement) and its placed one as the workers place (the demand seen so far, then every other
    active adapter, onto a local disk tier that holds the whole share, 10 fetches/s, re-planned every
    10 s, on LPX_WORKER_PLACEMENT_POSITIONS ring positions: the worker's defaults). `handoff_share`: the
    share of requests the workers passed on over the bound in the measured run (the simulator takes it as
    given and models where those requests go: to any worker under the bound; 0: none)."""
    config = SimConfig(
        adapters=args.adapters,
        top_k=args.top_k,
        top_share=args.top_share,
        requests_per_s=args.rate,
        duration_s=args.duration,
        warmup_s=args.warmup,
        output_tokens=args.tokens,
        replicas=args.workers,
        engine_slots=spec.max_loras,
        host_cache_adapters=spec.max_cpu_loras,
        tok_s_per_replica=spec.capacity * spec.decode_tok_s,
        max_running=spec.capacity,
        mixed_adapter_overhead=0.0,
        fetch_s_min=0.02,
        fetch_s_max=0.08,
        placement_demand="active",
        placement_fetch_per_s=10.0,
        placement_interval_s=10.0,
        disk_cache_adapters=args.adapters,
        placement_successors=placement_positions(),
        handoff_share=handoff_share,
        seed=args.seed,
    )
    report = run_comparison(config, [routing_of(policy)], storm=False)
    return report.steady[routing_of(policy)], report.placed[routing_of(policy)]


# --- runs -------------------------------------------------------------------------------------------
async def run_policy(
    stack, state: Path, key: str, aliases: list[str], stream, args, policy: str, faults: bool = False
) -> tuple[dict, list[Sample]]:
    from libs.client import LoraplexClient

    spec = FleetSpec(
        routing_policy=routing_of(policy), decode_tok_s=args.decode_tok_s, load_bound=policy == "bounded_load"
    )
    fleet = Fleet(env_file=stack.env_file, state=state / f"{policy}{'-faults' if faults else ''}", spec=spec)
    fleet.up(args.gateways, args.workers)
    killed: dict = {}
    try:
        await fleet.wait_ready(args.workers)

        def maybe_kill(at: float) -> None:
            if faults and not killed and at >= args.warmup + args.duration / 2:
                fleet.kill(fleet.gateways["gw-0"][0])
                for i in range(args.workers // 4):
                    fleet.kill(fleet.workers[f"sim-{i}"])
                killed["at"] = at

        connections = ConnectionSettings.load(stack.env_file)
        async with LoraplexClient(connections.nats_url, api_key=key, **_operator(connections)) as client:
            samples = await drive(client, key, stream, aliases, args, on_tick=maybe_kill)
            summary = summarise(samples, args.workers, DEFAULT_BALANCE_FACTOR)
            handed, kept_over = await bound_counts(client.js)
            summary["passed_on_per_1000"] = handed * 1000.0 / max(1, len(samples))
            summary["kept_over_bound"] = kept_over
            if faults:
                summary.update(await exactly_once(client, samples))
    finally:
        fleet.stop()
    return summary, samples


def routing_of(policy: str) -> str:
    """The gateways' routing policy of a benchmark policy (bounded_load_approx routes as bounded_load)."""
    return "bounded_load" if policy == "bounded_load_approx" else policy


async def bound_counts(js) -> tuple[int, int]:
    """Messages the workers passed on over the load bound in this run, and pool messages they kept over it
    after too many returns (their heartbeats' counts)."""
    from libs.fleetview.sources import read_heartbeats

    beats = [b for b in (await read_heartbeats(js)).beats.values() if b.pool == FleetSpec().pool]
    return sum(b.bound_passed_on for b in beats), sum(b.bound_kept_over for b in beats)


def _operator(connections) -> dict:
    """The benchmark reads the results stream's per-subject counts: it connects as the operator."""
    auth = connections.nats_auth("admin")
    return {"user": auth["user"], "password": auth["password"]} if auth else {}


async def exactly_once(client, samples: list[Sample]) -> dict:
    """Lost: no ok answer. Duplicated: more than one stored answer for one submission."""
    tenant = client.tenant
    info = await client.js.stream_info(subjects.RESULTS_STREAM, subjects_filter=subjects.tenant_results_filter(tenant))
    counts = info.state.subjects or {}
    lost = [s for s in samples if not s.result.ok]
    duplicated = sum(counts.get(subjects.tenant_results(tenant, s.rid), 0) > 1 for s in samples)
    reasons = sorted({f"{s.result.error.code}: {s.result.error.message}" for s in lost if s.result.error})
    return {"submissions": len(samples), "lost": len(lost), "duplicated": duplicated, "lost_reasons": reasons[:5]}


async def main_async(args) -> dict:
    base = fetch(BASE).path
    state = Path(tempfile.mkdtemp(prefix="lpx-bench-fleet-"))
    os.chmod(state, 0o755)
    adapters = make_adapters(base, state / "adapters", args.adapters)
    stack = Stack(StackConfig(dir=state / "stack"))
    stack.up()
    try:
        async with registry_process(stack.env_file, "lpx_bench_fleet", state / "registry.log") as registry_url:
            key, digests = await setup_registry(registry_url, adapters)
            aliases = sorted(digests)
            stream = make_traffic(
                args.adapters, args.top_k, args.top_share, args.rate, args.warmup + args.duration, args.seed
            )
            print(
                f"  {len(stream)} requests per run, {args.adapters} adapters, {args.workers} workers, "
                f"{args.gateways} gateways",
                flush=True,
            )
            measured, faults = {}, {}
            for policy in args.policies:
                measured[policy], _ = await run_policy(stack, state, key, aliases, stream, args, policy)
                print(f"  measured {policy}", flush=True)
            if args.faults:
                faults, _ = await run_policy(stack, state, key, aliases, stream, args, "bounded_load", faults=True)
            predicted, predicted_steady, predicted_handoffs = {}, {}, {}
            spec = FleetSpec(decode_tok_s=args.decode_tok_s)
            for policy in args.policies:  # the workers run placement: `predicted` is the placed scenario
                predicted_steady[policy], predicted[policy] = predict(args, policy, spec, 0.0)
                handed = measured[policy]["passed_on_per_1000"] / 1000.0
                if handed:
                    predicted_handoffs[policy] = predict(args, policy, spec, handed)[1]
    finally:
        stack.purge()
    return {
        "config": vars(args) | {"out": str(args.out)},
        "measured": measured,
        "predicted": predicted,
        "predicted_without_placement": predicted_steady,
        "predicted_with_handoffs": predicted_handoffs,
        "faults": faults,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    parser.add_argument("--gateways", type=int, default=3)
    parser.add_argument("--workers", type=int, default=32)
    parser.add_argument("--adapters", type=int, default=500)
    parser.add_argument("--rate", type=float, default=30.0, help="requests per second (Poisson)")
    parser.add_argument("--duration", type=float, default=60.0, help="measured seconds")
    parser.add_argument(
        "--warmup",
        type=float,
        default=60.0,
        help="seconds sent before measuring (placement's fetches, 2 ring positions each, are done by then)",
    )
    parser.add_argument("--tokens", type=int, default=32, help="max_tokens per request")
    parser.add_argument("--decode-tok-s", type=float, default=16.0, help="simulated decode rate per sequence")
    parser.add_argument("--top-k", type=int, default=25, help="the most popular adapters ...")
    parser.add_argument("--top-share", type=float, default=0.8, help="... carry this share of the requests")
    parser.add_argument("--policies", nargs="*", default=["bounded_load", "bounded_load_approx", "random"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-faults", dest="faults", action="store_false", help="skip the fault run")
    args = parser.parse_args()
    import logging

    logging.getLogger().setLevel(logging.WARNING)
    render(asyncio.run(main_async(args)), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
