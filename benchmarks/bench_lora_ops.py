"""Multi-LoRA op microbenchmark (CPU): loraplex's segment-grouped ops against vLLM's own torch ops.

One LoRA-wrapped projection of SmolLM2-135M's MLP (576 -> 1536, the widest): shrink (x @ A.T, scaled)
then expand (+= s @ B.T), as vLLM's CPU punica wrapper calls them, over a grid of tokens in the batch
x adapters in the batch x rank, with a quarter of the rows on the base model (index -1). Then a whole
qkv layer (3 slices: 576 -> 576 + 192 + 192) through the punica wrapper's `add_lora_linear`: vLLM's
method on its ops against loraplex's grouped one (rows selected once per adapter for all slices). vLLM's ops
are run with loraplex's no-LoRA fix (without it they give base rows the last adapter's delta, so they
are not a correct peer); the ops are timed alone, median of repeats, and outputs compared.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from libs.engine import cpu_lora_ops, vllm_patches

WIDTH_IN, WIDTH_OUT, SLOTS = 576, 1536, 8


def _inputs(tokens: int, adapters: int, rank: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    lora_a = torch.randn(SLOTS, 1, rank, WIDTH_IN, generator=gen) * 0.02
    lora_b = torch.randn(SLOTS, 1, WIDTH_OUT, rank, generator=gen) * 0.02
    x = torch.randn(tokens, WIDTH_IN, generator=gen)
    indices = torch.randint(0, adapters, (tokens,), generator=gen)
    indices[torch.rand(tokens, generator=gen) < 0.25] = -1  # base-model rows mixed in
    return lora_a, lora_b, x, indices


def _layer(ops: dict, lora_a, lora_b, x, indices) -> torch.Tensor:
    rank = lora_a.shape[2]
    buffer = torch.zeros(x.shape[0], rank)
    out = torch.zeros(x.shape[0], WIDTH_OUT)
    ops["bgmv_shrink"](x, lora_a, buffer, indices, 0.5)
    ops["bgmv_expand_slice"](buffer, lora_b, out, indices, 0, WIDTH_OUT, True)
    return out


def _time(fn, repeats: int) -> float:
    fn()  # warm-up
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def measure(tokens: int, adapters: int, rank: int, repeats: int, vllm_ops: dict) -> dict:
    args = _inputs(tokens, adapters, rank)
    grouped = cpu_lora_ops.GROUPED
    same = torch.allclose(_layer(vllm_ops, *args), _layer(grouped, *args), rtol=1e-4, atol=1e-5)
    vllm_s = _time(lambda: _layer(vllm_ops, *args), repeats)
    grouped_s = _time(lambda: _layer(grouped, *args), repeats)
    return {
        "tokens": tokens,
        "adapters": adapters,
        "rank": rank,
        "vllm_us": vllm_s * 1e6,
        "grouped_us": grouped_s * 1e6,
        "speedup": vllm_s / grouped_s,
        "outputs_match": bool(same),
    }


QKV = (576, 192, 192)


def _qkv_inputs(tokens: int, adapters: int, rank: int, seed: int = 1):
    from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU

    gen = torch.Generator().manual_seed(seed)
    lora_a = tuple(torch.randn(SLOTS, 1, rank, WIDTH_IN, generator=gen) * 0.02 for _ in QKV)
    lora_b = tuple(torch.randn(SLOTS, 1, size, rank, generator=gen) * 0.02 for size in QKV)
    x = torch.randn(tokens, WIDTH_IN, generator=gen)
    indices = torch.randint(0, adapters, (tokens,), generator=gen)
    indices[torch.rand(tokens, generator=gen) < 0.25] = -1
    wrapper = PunicaWrapperCPU(max_num_batched_tokens=max(tokens, 1), max_batches=8, device="cpu")
    wrapper._token_lora_indices[:tokens].copy_(indices)
    wrapper.indices_len[0] = tokens
    wrapper.is_prefill = False  # the bgmv path: per-token indices, what the vLLM ops see in decode
    return wrapper, lora_a, lora_b, x


def measure_layer(tokens: int, adapters: int, rank: int, repeats: int) -> dict:
    wrapper, lora_a, lora_b, x = _qkv_inputs(tokens, adapters, rank)
    vllm_method = vllm_patches.ORIGINALS["add_lora_linear"]

    def layer(method) -> torch.Tensor:
        y = torch.zeros(tokens, sum(QKV))
        method(wrapper, y, x, lora_a, lora_b, 1.0, QKV)
        return y

    same = torch.allclose(layer(vllm_method), layer(cpu_lora_ops.grouped_add_lora_linear), rtol=1e-4, atol=1e-5)
    vllm_s = _time(lambda: layer(vllm_method), repeats)
    grouped_s = _time(lambda: layer(cpu_lora_ops.grouped_add_lora_linear), repeats)
    return {
        "tokens": tokens,
        "adapters": adapters,
        "rank": rank,
        "vllm_us": vllm_s * 1e6,
        "grouped_us": grouped_s * 1e6,
        "speedup": vllm_s / grouped_s,
        "outputs_match": bool(same),
    }


def _print(title: str, rows: list[dict]) -> None:
    print(f"\n{title}")
    print(f"{'rank':>4} {'adapters':>8} {'tokens':>6} {'vllm us':>10} {'grouped us':>10} {'speedup':>8} {'match':>6}")
    for r in rows:
        print(
            f"{r['rank']:>4} {r['adapters']:>8} {r['tokens']:>6} {r['vllm_us']:10.0f} {r['grouped_us']:10.0f} "
            f"{r['speedup']:7.1f}x {str(r['outputs_match']):>6}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--tokens", type=int, nargs="*", default=[1, 16, 128, 512])
    parser.add_argument("--adapters", type=int, nargs="*", default=[1, 2, 4, 8])
    parser.add_argument("--ranks", type=int, nargs="*", default=[8, 16])
    args = parser.parse_args()
    vllm_patches.apply("vllm")  # record vLLM's originals; the -1 fix wraps them for a correct peer
    vllm_ops = {
        name: vllm_patches._skip_no_lora_rows(vllm_patches.ORIGINALS[name]) for name in vllm_patches._GATHER_OPS
    }
    torch.set_num_threads(max(1, torch.get_num_threads()))
    grid = [(t, a, r) for r in args.ranks for a in args.adapters for t in args.tokens]
    rows = [measure(t, a, r, args.repeats, vllm_ops) for t, a, r in grid]
    layers = [measure_layer(t, a, r, args.repeats) for t, a, r in grid]
    threads = torch.get_num_threads()
    _print(f"one op pair: shrink+expand, {WIDTH_IN}->{WIDTH_OUT}, 25% base rows, {threads} threads", rows)
    _print(f"one qkv layer (add_lora_linear, 3 slices {QKV}), 25% base rows, {threads} threads", layers)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "lora_ops.json").write_text(json.dumps({"op_pair": rows, "qkv_layer": layers}, indent=2))
    _plot(rows, args.out / "lora_ops.png")
    print(f"written {args.out / 'lora_ops.json'}")
    return 0 if all(r["outputs_match"] for r in rows + layers) else 1


def _plot(rows: list[dict], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5), sharey=True)
    for ax, rank in zip(axes, sorted({r["rank"] for r in rows}), strict=False):
        for adapters in sorted({r["adapters"] for r in rows}):
            sel = [r for r in rows if r["rank"] == rank and r["adapters"] == adapters]
            ax.plot([r["tokens"] for r in sel], [r["speedup"] for r in sel], marker="o", label=f"{adapters} adapters")
        ax.set_xscale("log")
        ax.set_title(f"rank {rank}")
        ax.set_xlabel("tokens in the batch")
    axes[0].set_ylabel("speed-up over vLLM's CPU ops")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
