"""Worker benchmark: adapter load latency per tier, and engine tok/s base-only vs mixed adapters.

Real parts: a local stack (S3 store), the real SmolLM2-135M base, real rank-16 PEFT adapters, one
vLLM engine (CPU build here). Tiers are measured through the worker's own AdapterTiers code:
  object_store: not on disk, not in the engine (download + verify + load into the engine)
  disk:         on local disk, evicted from the engine's host-RAM cache (load from disk)
  cpu:          in the engine's host-RAM LoRA cache (activation happens inside the step)
  gpu:          in an engine slot already (the adapter of the previous request)
For each tier: the time to make the adapter usable (acquire) and the time to first token of a
1-token request, median over repeats. Then throughput: N concurrent requests, base-only vs spread over
K adapters, same prompts and lengths, side by side, reported as a ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from libs.contracts import AdapterRef, AdapterTier
from libs.engine import EngineConfig, GenerationRequest, create_engine
from libs.lora.format import read_adapter
from libs.lora.train import LoraRecipe, random_adapters
from libs.models.bootstrap import fetch
from libs.objectstore import ObjectStore
from libs.paths import lpx_home
from libs.settings import ConnectionSettings
from libs.stack import Stack, StackConfig
from services.worker.disk_cache import DiskCache
from services.worker.tiers import AdapterTiers

QUESTION = [{"role": "user", "content": "Where is my order? Please explain the shipping process."}]


def make_adapters(base: Path, count: int) -> list[Path]:
    root = lpx_home() / "bench-artifacts" / "adapters"
    outs = {seed: root / f"r16-seed{seed}" for seed in range(500, 500 + count)}
    missing = {s: p for s, p in outs.items() if not (p / "adapter_model.safetensors").exists()}
    if missing:
        random_adapters(base, missing, LoraRecipe(rank=16), scale=0.05)
    return list(outs.values())


async def ttft(engine, adapter_spec, rid: str, max_tokens: int = 1) -> float:
    started = time.perf_counter()
    async for chunk in engine.generate(
        GenerationRequest(rid, messages=QUESTION, max_tokens=max_tokens, adapter=adapter_spec)
    ):
        if chunk.token_ids:
            return time.perf_counter() - started
    return time.perf_counter() - started


async def measure_tiers(engine, tiers: AdapterTiers, refs: list[AdapterRef], repeats: int) -> dict:
    samples: dict[str, dict[str, list[float]]] = {
        t: {"acquire_s": [], "ttft_s": []} for t in ("object_store", "disk", "cpu", "gpu", "base")
    }
    n = 0

    async def one(ref, expect: AdapterTier | None):
        nonlocal n
        n += 1
        if ref is None:
            samples["base"]["acquire_s"].append(0.0)
            samples["base"]["ttft_s"].append(await ttft(engine, None, f"b{n}"))
            return
        lease = await tiers.acquire(ref)
        try:
            assert expect is None or lease.tier == expect, (lease.tier, expect)
            samples[lease.tier.value]["acquire_s"].append(lease.load_s)
            samples[lease.tier.value]["ttft_s"].append(await ttft(engine, lease.spec, f"r{n}"))
        finally:
            tiers.release(lease)

    # The engine has 2 slots and a host cache of 3: walking 4+ adapters round-robin evicts each from
    # the engine before it comes round again (disk tier); walking 3 keeps them all in the host cache
    # while the 2 most recent hold the slots (so the next one is a cpu-tier hit).
    for ref in refs[:repeats]:
        await one(ref, AdapterTier.OBJECT_STORE)  # first sight: from S3
        await one(ref, AdapterTier.GPU)  # again right away: still in its slot
    for _ in range(2):
        for ref in refs[:repeats]:
            await one(ref, AdapterTier.DISK)
    trio = refs[:3]
    for ref in trio:
        await one(ref, None)
    for _ in range(2):
        for ref in trio:
            await one(ref, AdapterTier.CPU)
    for _ in range(repeats):
        await one(None, None)
    return {
        tier: {k: (statistics.median(v) if v else None) for k, v in d.items()} | {"n": len(d["ttft_s"])}
        for tier, d in samples.items()
    }


async def throughput(engine, specs, concurrency: int, max_tokens: int) -> dict:
    async def run(i: int, spec):
        tokens = 0
        async for chunk in engine.generate(
            GenerationRequest(
                f"tp-{id(specs)}-{i}-{time.time_ns()}", messages=QUESTION, max_tokens=max_tokens, adapter=spec
            )
        ):
            tokens = chunk.completion_tokens
        return tokens

    started = time.perf_counter()
    counts = await asyncio.gather(*(run(i, specs[i % len(specs)]) for i in range(concurrency)))
    wall = time.perf_counter() - started
    return {"requests": concurrency, "tokens": sum(counts), "wall_s": wall, "tok_per_s": sum(counts) / wall}


async def main_async(args) -> dict:
    base = fetch("smollm2-135m").path
    paths = make_adapters(base, max(args.repeats, args.mixed_adapters, 4))
    state = Path(tempfile.mkdtemp(prefix="lpx-bench-stack-"))
    os.chmod(state, 0o755)
    stack = Stack(StackConfig(dir=state))
    stack.up()
    engine = create_engine(EngineConfig(model_path=base, max_loras=2, max_cpu_loras=3, max_num_seqs=32))
    try:
        store = ObjectStore(ConnectionSettings.load(stack.env_file))
        refs = []
        for p in paths:
            files = read_adapter(p)
            digest, prefix = store.put_adapter(p, files.file_digests)
            refs.append(
                AdapterRef(
                    digest=digest,
                    object_key=prefix,
                    base_model="smollm2-135m",
                    rank=files.rank,
                    size_bytes=files.size_bytes,
                )
            )
        await engine.start()
        disk = DiskCache(state / "disk-cache", 10 * 1024**3, store)
        tiers = AdapterTiers(disk, engine, base_model="smollm2-135m", max_rank=16, max_loras=2, max_cpu_loras=3)
        await ttft(engine, None, "warmup", max_tokens=4)
        tier_report = await measure_tiers(engine, tiers, refs, args.repeats)
        leases = [await tiers.acquire(r) for r in refs[: args.mixed_adapters]]
        base_tp = await throughput(engine, [None], args.concurrency, args.tokens)
        mixed_tp = await throughput(engine, [lease.spec for lease in leases], args.concurrency, args.tokens)
        base_tp2 = await throughput(engine, [None], args.concurrency, args.tokens)  # drift check
    finally:
        await engine.shutdown()
        stack.purge()
    return {
        "adapter": {"rank": refs[0].rank, "bytes": refs[0].size_bytes, "dtype": "float32"},
        "tiers": tier_report,
        "throughput": {
            "base_only": base_tp,
            "mixed_adapters": mixed_tp,
            "base_only_again": base_tp2,
            "mixed_over_base": mixed_tp["tok_per_s"] / base_tp["tok_per_s"],
            "adapters_in_mixed_batch": args.mixed_adapters,
        },
    }


def render(report: dict, out: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(
        title=f"adapter load latency per tier (rank {report['adapter']['rank']}, "
        f"{report['adapter']['bytes'] / 1e6:.1f} MB)"
    )
    for col in ("tier", "n", "acquire (median)", "TTFT 1 token (median)"):
        table.add_column(col)
    for tier, row in report["tiers"].items():
        if row["n"]:
            table.add_row(tier, str(row["n"]), f"{row['acquire_s'] * 1000:.1f} ms", f"{row['ttft_s'] * 1000:.1f} ms")
    console.print(table)
    tp = report["throughput"]
    t2 = Table(title="engine throughput, same workload side by side")
    for col in ("batch", "requests", "tokens", "wall", "tok/s"):
        t2.add_column(col)
    for name in ("base_only", "mixed_adapters", "base_only_again"):
        r = tp[name]
        t2.add_row(name, str(r["requests"]), str(r["tokens"]), f"{r['wall_s']:.1f}s", f"{r['tok_per_s']:.1f}")
    console.print(t2)
    console.print(
        f"mixed-adapter / base-only throughput: {tp['mixed_over_base']:.2f}x "
        f"({tp['adapters_in_mixed_batch']} adapters in the batch)"
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / "worker.json").write_text(json.dumps(report, indent=2))
    _plot(report, out / "worker_tiers.png")
    console.print(f"wrote {out / 'worker.json'} and {out / 'worker_tiers.png'}")


def _plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [(t, r) for t, r in report["tiers"].items() if r["n"]]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    names = [t for t, _ in rows]
    ax.bar(names, [r["acquire_s"] * 1000 for _, r in rows], label="acquire (load)")
    ax.bar(
        names,
        [r["ttft_s"] * 1000 for _, r in rows],
        bottom=[r["acquire_s"] * 1000 for _, r in rows],
        label="TTFT (1 token)",
    )
    ax.set_ylabel("ms (median)")
    ax.set_title("SmolLM2-135M rank-16 adapter: latency by tier")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    parser.add_argument("--repeats", type=int, default=4, help="adapters per tier measurement (>= 4)")
    parser.add_argument("--concurrency", type=int, default=16, help="requests in the throughput batch")
    parser.add_argument("--tokens", type=int, default=48, help="output tokens per request")
    parser.add_argument("--mixed-adapters", type=int, default=2, help="adapters in the mixed batch (<= max_loras)")
    args = parser.parse_args()
    render(asyncio.run(main_async(args)), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
