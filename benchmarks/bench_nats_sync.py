"""What durability costs: JetStream publish latency and throughput with the stack's choices side by
side, in one run, on this machine.

  * single node, sync_interval default (NATS' 2 min: acked once in the page cache)
  * single node, sync_interval always (fsync before every ack: the stack's single-node default)
  * 3-node cluster, R3, default sync (the stack's cluster default: acked once on a quorum)

Each config gets a fresh nats-server (or three) from the same binary as `lpx stack up`, a file
stream like LPX_RESULTS, and the same workload: sequential publishes (one in flight: latency) and
windows of 64 concurrent publishes (throughput), each with a Nats-Msg-Id like the platform's.
Prints a table with ratios to the default, writes bench-results/nats_sync.json and a plot.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from libs.bus.provision import ensure_streams
from libs.contracts import subjects
from libs.stack import Stack, StackConfig

SPEC = next(s for s in subjects.STREAMS if s.name == subjects.RESULTS_STREAM)
PAYLOAD = b"x" * 512  # about an InferenceResult of a short answer


def start(nodes: int, sync: str) -> tuple[Stack, Path, dict]:
    """The whole local stack with this NATS setup (PostgreSQL and S3 idle beside it)."""
    state = Path(tempfile.mkdtemp(prefix="lpx-bench-nats-"))
    state.chmod(0o755)
    stack = Stack(StackConfig(dir=state, nats_nodes=nodes, nats_sync=sync, start_timeout_s=90))
    return stack, state, stack.up()


def operator_auth(env: dict[str, str]) -> dict[str, str]:
    import json

    return {"user": "admin", "password": json.loads(env["LPX_NATS_PASSWORDS"])["admin"]}


async def measure(urls: str, replicas: int, sequential: int, windows: int, auth: dict) -> dict:
    import nats

    deadline = time.monotonic() + 30
    while True:  # a cluster answers JetStream requests once it has a meta leader
        try:
            await ensure_streams(urls, [SPEC], replicas=replicas, auth=auth)
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)
    nc = await nats.connect(servers=urls.split(","), **auth)
    js = nc.jetstream()
    latencies = []
    for i in range(sequential):
        t0 = time.perf_counter()
        await js.publish(subjects.results(f"seq{i}"), PAYLOAD, headers={"Nats-Msg-Id": f"seq-{i}"})
        latencies.append(time.perf_counter() - t0)
    started = time.perf_counter()
    for w in range(windows):
        await asyncio.gather(
            *(
                js.publish(subjects.results(f"w{w}-{i}"), PAYLOAD, headers={"Nats-Msg-Id": f"w{w}-{i}"})
                for i in range(64)
            )
        )
    burst_s = time.perf_counter() - started
    await nc.drain()
    latencies.sort()
    return {
        "p50_ms": 1000 * statistics.median(latencies),
        "p99_ms": 1000 * latencies[int(0.99 * len(latencies))],
        "msgs_per_s": windows * 64 / burst_s,
    }


def run(nodes: int, sync: str, sequential: int, windows: int) -> dict:
    stack, state, env = start(nodes, sync)
    try:
        return asyncio.run(measure(env["LPX_NATS_URL"], min(nodes, 3), sequential, windows, operator_auth(env)))
    finally:
        stack.down()
        shutil.rmtree(state, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    parser.add_argument("--sequential", type=int, default=500, help="publishes one at a time (latency)")
    parser.add_argument("--windows", type=int, default=40, help="windows of 64 concurrent publishes (throughput)")
    args = parser.parse_args()
    configs = [
        ("1 node, sync default", 1, "default"),
        ("1 node, sync always", 1, "always"),
        ("3 nodes R3, sync default", 3, "default"),
    ]
    rows = []
    for label, nodes, sync in configs:
        result = run(nodes, sync, args.sequential, args.windows)
        rows.append({"config": label, "nodes": nodes, "sync_interval": sync, **result})
        print(f"  measured {label}", flush=True)
    ref = rows[0]
    print(f"\n{'config':<26} {'p50 ms':>8} {'p99 ms':>8} {'msgs/s':>9} {'p50 x':>7} {'msgs/s x':>9}")
    for r in rows:
        r["p50_ratio"] = r["p50_ms"] / ref["p50_ms"]
        r["throughput_ratio"] = r["msgs_per_s"] / ref["msgs_per_s"]
        print(
            f"{r['config']:<26} {r['p50_ms']:8.2f} {r['p99_ms']:8.2f} {r['msgs_per_s']:9.0f} "
            f"{r['p50_ratio']:7.2f} {r['throughput_ratio']:9.2f}"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "nats_sync.json").write_text(json.dumps(rows, indent=2))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
        names = [r["config"] for r in rows]
        axes[0].bar(names, [r["p50_ms"] for r in rows])
        axes[0].set_ylabel("publish p50 (ms)")
        axes[1].bar(names, [r["msgs_per_s"] for r in rows])
        axes[1].set_ylabel("acked publishes/s (64 in flight)")
        for ax in axes:
            ax.tick_params(axis="x", labelrotation=15, labelsize=8)
        fig.tight_layout()
        fig.savefig(args.out / "nats_sync.png", dpi=110)
    except ImportError:
        pass
    print(f"written {args.out / 'nats_sync.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
