"""Calibrate the engine's cost model: decode step time against the number of running sequences, and
prefill rate, measured on the real vLLM engine with the worker's engine settings.

For each batch size b, b requests (spread over `--adapters` rank-16 adapters, as tenants' requests are)
start together and decode `--tokens` tokens each; a request's step time is its inter-token time after
the first token, and the size's figure is the median over its requests. Prefill is timed on one request
alone (its time to first token over its prompt tokens). The profile is what the simulated engine reads
(`LPX_WORKER_SIM_PROFILE`) and what the worker's latency guard derives its batch bound from
(`LPX_WORKER_LATENCY_PROFILE`). The demo model's profile ships at libs/engine/profiles/.

  python benchmarks/calibrate_engine.py                      # writes libs/engine/profiles/smollm2-135m-cpu.json
  python benchmarks/calibrate_engine.py --sizes 1 4 16 --out /tmp/profile.json
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from rich.progress import Progress

from libs.engine import AdapterSpec, EngineConfig, GenerationRequest, create_engine
from libs.engine.profile import EngineProfile, default_profile_path
from libs.lora.train import LoraRecipe, random_adapters
from libs.models.bootstrap import fetch
from libs.paths import lpx_home

QUESTION = [{"role": "user", "content": "Where is my order? Please explain the shipping process."}]


def adapters(base: Path, count: int) -> list[AdapterSpec]:
    root = lpx_home() / "bench-artifacts" / "adapters"
    outs = {seed: root / f"r16-seed{seed}" for seed in range(500, 500 + count)}
    missing = {s: p for s, p in outs.items() if not (p / "adapter_model.safetensors").exists()}
    if missing:
        random_adapters(base, missing, LoraRecipe(rank=16), scale=0.05)
    return [AdapterSpec(digest=hashlib.sha256(str(path).encode()).hexdigest(), path=path) for path in outs.values()]


async def one_request(engine, rid: str, spec: AdapterSpec | None, tokens: int) -> tuple[float, list[float], int]:
    """(time to first token, inter-token gaps, prompt tokens)."""
    started = time.perf_counter()
    stamps: list[float] = []
    prompt_tokens = 0
    request = GenerationRequest(rid, messages=QUESTION, max_tokens=tokens, adapter=spec)
    async for chunk in engine.generate(request):
        stamps.extend([time.perf_counter()] * max(1, len(chunk.token_ids)))
        prompt_tokens = chunk.prompt_tokens or prompt_tokens
    gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False) if b > a]
    return stamps[0] - started, gaps, prompt_tokens


async def step_time(engine, specs: list[AdapterSpec], size: int, tokens: int) -> float:
    runs = await asyncio.gather(
        *(one_request(engine, f"cal-{size}-{i}-{time.time_ns()}", specs[i % len(specs)], tokens) for i in range(size))
    )
    per_request = [statistics.median(gaps) for _, gaps, _ in runs if gaps]
    return statistics.median(per_request)


async def calibrate(args) -> EngineProfile:
    base = fetch(args.base_model).path
    specs = adapters(base, args.adapters)
    config = EngineConfig(
        model_path=base, max_loras=max(args.adapters, 2), max_num_seqs=max(args.sizes), cpu_kvcache_gib=1
    )
    engine = create_engine(config)
    await engine.start()
    try:
        for spec in specs:
            await engine.add_adapter(spec)
        await step_time(engine, specs, 2, 8)  # warm-up: first steps compile and allocate
        steps: dict[int, float] = {}
        with Progress() as bar:
            task = bar.add_task("decode step time per batch size", total=len(args.sizes) + 1)
            for size in args.sizes:
                steps[size] = min([await step_time(engine, specs, size, args.tokens) for _ in range(args.repeats)])
                bar.advance(task)
            ttfts = [await one_request(engine, f"pre-{i}", specs[0], 1) for i in range(args.repeats)]
            bar.advance(task)
        best_ttft, _, prompt_tokens = min(ttfts)
        return EngineProfile(
            base_model=args.base_model,
            device=config.device if config.device != "auto" else _device(),
            decode_step_s=steps,
            prefill_tok_s=prompt_tokens / best_ttft,
            tokens=args.tokens,
            adapters=args.adapters,
            commit=_commit(),
            machine=f"{platform.machine()}, {os.cpu_count()} cores",
            created=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        )
    finally:
        await engine.shutdown()


def _device() -> str:
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:
        return "cpu"


def _commit() -> str:
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True)
    return (out.stdout.strip() or "unknown") + ("+dirty" if dirty.stdout.strip() else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-model", default="smollm2-135m")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4, 6, 8, 12, 16])
    parser.add_argument("--tokens", type=int, default=24, help="tokens decoded per request")
    parser.add_argument("--adapters", type=int, default=2, help="distinct adapters the requests spread over")
    parser.add_argument("--repeats", type=int, default=2, help="runs per size (the fastest counts)")
    parser.add_argument("--out", type=Path, default=None, help="default: the shipped profile of the base model")
    args = parser.parse_args()
    profile = asyncio.run(calibrate(args))
    out = args.out or default_profile_path(args.base_model, profile.device)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(profile.model_dump_json(indent=2) + "\n")
    print(f"{'running':>8} | {'step (ms)':>9} | {'x solo':>6} | {'tok/s':>7}")
    for size, step in sorted(profile.decode_step_s.items()):
        print(f"{size:>8} | {step * 1000:>9.1f} | {step / profile.solo_step_s:>6.2f} | {size / step:>7.1f}")
    print(f"prefill {profile.prefill_tok_s:.0f} tok/s; written to {out}")


if __name__ == "__main__":
    main()
