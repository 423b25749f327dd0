"""bench_vs_vllm's report: loraplex/peer ratios per round with their spread and a verdict, the stage
timeline, the tables, the JSON, the plot and the RESULTS.md entry."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import httpx

# (run key, label, higher is better)
METRICS = (
    ("tok_per_s", "throughput", True),
    ("latency_p50_s", "p50", False),
    ("latency_p95_s", "p95", False),
    ("ttft_p50_s", "TTFT p50", False),
)
_STAGE_LINE = re.compile(r'^lpx_gateway_stage\w*_(sum|count)\{[^}]*stage="(\w+)"[^}]*\} (\S+)$')
_FAIR_WAIT_LINE = re.compile(r"^lpx_gateway_fair_wait\w*_(sum|count)\{[^}]*\} (\S+)$")
FAIR_WAIT = "fair_wait"  # part of gateway_in: waiting in the gateway's fair queue for a full pool


async def scrape_stages(port: int) -> dict[tuple[str, str], float]:
    """(stage, 'sum'|'count') -> value, from the gateway's Prometheus endpoint."""
    async with httpx.AsyncClient(timeout=10) as http:
        text = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
    found = {}
    for line in text.splitlines():
        match = _STAGE_LINE.match(line)
        if match:
            found[(match.group(2), match.group(1))] = float(match.group(3))
        elif match := _FAIR_WAIT_LINE.match(line):  # summed over tenants and tiers
            key = (FAIR_WAIT, match.group(1))
            found[key] = found.get(key, 0.0) + float(match.group(2))
    return found


def stage_means(before: dict, after: dict) -> dict[str, float]:
    """Mean milliseconds per request for each stage, over the requests between the two scrapes."""
    from services.gateway.timeline import STAGES

    means = {}
    for stage in STAGES:
        count = after.get((stage, "count"), 0.0) - before.get((stage, "count"), 0.0)
        total = after.get((stage, "sum"), 0.0) - before.get((stage, "sum"), 0.0)
        if count > 0:
            means[stage] = 1000 * total / count
    requests = after.get(("reply", "count"), 0.0) - before.get(("reply", "count"), 0.0)
    if requests > 0:  # over every request, as the stages are, not over those that waited
        means[FAIR_WAIT] = 1000 * (after.get((FAIR_WAIT, "sum"), 0.0) - before.get((FAIR_WAIT, "sum"), 0.0)) / requests
    return means


def added_ms(stages_ms: dict[str, float]) -> float:
    """What loraplex adds around the engine: every stage but prefill and decode (mean ms per request)."""
    from services.gateway.timeline import ENGINE_STAGES, STAGES

    return sum(v for k, v in stages_ms.items() if k in STAGES and k not in ENGINE_STAGES)


def verdict(low: float, high: float, higher_is_better: bool) -> str:
    """A spread that straddles 1.0 is a tie: the difference is inside the noise of the rounds. One round
    has no spread, so no verdict."""
    if low == high:
        return "n/a (1 round)"
    if low <= 1.0 <= high:
        return "tie"
    return "win" if (low > 1.0) == higher_is_better else "loss"


def compare(rounds: list[dict], mix: str, peer: str) -> dict:
    """loraplex / `peer` for one mix: each round's ratio (loraplex's run beside that round's peer run)."""
    out = {}
    for key, label, higher in METRICS:
        ratios = [r["loraplex"][mix][key] / r[peer][mix][key] for r in rounds]
        low, high = min(ratios), max(ratios)
        out[label] = {
            "median": statistics.median(ratios),
            "min": low,
            "max": high,
            "rounds": ratios,
            "verdict": verdict(low, high, higher),
        }
    pairs = [
        (a["text"], b["text"])
        for r in rounds
        for a, b in zip(r[peer][mix]["samples"], r["loraplex"][mix]["samples"], strict=True)
    ]
    out["identical"] = f"{sum(a == b for a, b in pairs)}/{len(pairs)}"
    return out


def report(rounds: list[dict], mixes: list[str], peers: list[str], args) -> dict:
    vllm_peers = [p for p in peers if p != "loraplex"]
    comparisons = {peer: {mix: compare(rounds, mix, peer) for mix in mixes} for peer in vllm_peers}
    stages = {mix: _mean_stages([r["loraplex"][mix].get("stages_ms", {}) for r in rounds]) for mix in mixes}
    for turn in rounds:  # the texts were compared; keep the JSON readable
        for runs in turn.values():
            for run in runs.values():
                run["samples"] = [{k: v for k, v in s.items() if k != "text"} for s in run["samples"]]
    workload = {
        "requests": args.requests,
        "concurrency": args.concurrency,
        "max_tokens": args.tokens,
        "rounds": args.rounds,
        "max_loras": 2,
        "max_cpu_loras": 8,
        "model": "smollm2-135m",
        "greedy": True,
        "worker_env": args.worker_env,
    }
    return {
        "workload": workload,
        "peers": peers,
        "comparisons": comparisons,
        "stages_ms": stages,
        "rounds": rounds,
        "commit": getattr(args, "commit", None),
    }


def _mean_stages(per_round: list[dict[str, float]]) -> dict[str, float]:
    names = {name for stages in per_round for name in stages}
    return {name: statistics.mean(s.get(name, 0.0) for s in per_round) for name in names}


def ratio_markdown(rep: dict, peer: str) -> str:
    lines = [
        f"loraplex / {peer} (median of {rep['workload']['rounds']} rounds [min-max], verdict):",
        "",
        "| mix | throughput | p50 | p95 | TTFT p50 | identical outputs |",
        "|---|---|---|---|---|---|",
    ]
    for mix, c in rep["comparisons"][peer].items():
        cells = [
            f"{c[label]['median']:.2f}x [{c[label]['min']:.2f}-{c[label]['max']:.2f}] {c[label]['verdict']}"
            for _, label, _ in METRICS
        ]
        lines.append(f"| {mix} | " + " | ".join(cells) + f" | {c['identical']} |")
    return "\n".join(lines)


def stages_markdown(rep: dict) -> str:
    from services.gateway.timeline import STAGES

    mixes = list(rep["stages_ms"])
    lines = [
        "loraplex's time, mean ms per request by stage (gateway accept -> reply sent), mean of rounds:",
        "",
        "| stage | " + " | ".join(mixes) + " |",
        "|---" * (len(mixes) + 1) + "|",
    ]
    for stage in STAGES:
        lines.append(
            f"| {stage} | " + " | ".join(f"{rep['stages_ms'][m].get(stage, float('nan')):.1f}" for m in mixes) + " |"
        )
    lines.append(
        "| of gateway_in: fair-queue wait | "
        + " | ".join(f"{rep['stages_ms'][m].get(FAIR_WAIT, float('nan')):.1f}" for m in mixes)
        + " |"
    )
    lines.append(
        "| added around the engine | " + " | ".join(f"{added_ms(rep['stages_ms'][m]):.1f}" for m in mixes) + " |"
    )
    return "\n".join(lines)


def cpu_markdown(rep: dict) -> str:
    """CPU seconds per 1k generated tokens by kind of process (benchmarks/cpu_account.py), mean of rounds:
    on a machine whose cores the engine shares, what the front of each peer takes from the engine."""
    mixes = list(rep["stages_ms"])
    per = {
        (peer, kind): [
            statistics.mean(
                turn[peer][m]["cpu_s"].get(kind, 0.0) * 1000 / max(turn[peer][m]["tokens"], 1) for turn in rep["rounds"]
            )
            for m in mixes
        ]
        for peer in rep["peers"]
        for kind in sorted({k for turn in rep["rounds"] for m in mixes for k in turn[peer][m].get("cpu_s", {})})
    }
    if not per:
        return ""
    lines = [
        "CPU seconds per 1k tokens by process (every process on the machine during the run), mean of rounds:",
        "",
        "| peer | process | " + " | ".join(mixes) + " |",
        "|---" * (len(mixes) + 2) + "|",
    ]
    for peer in rep["peers"]:
        rows = [(kind, values) for (p, kind), values in per.items() if p == peer and max(values) >= 0.05]
        total = [sum(values[i] for (p, _), values in per.items() if p == peer) for i in range(len(mixes))]
        lines += [f"| {peer} | {kind} | " + " | ".join(f"{v:.2f}" for v in values) + " |" for kind, values in rows]
        lines.append(f"| {peer} | **all** | " + " | ".join(f"**{v:.2f}**" for v in total) + " |")
    return "\n".join(lines)


def runs_markdown(rep: dict) -> str:
    lines = ["| round | peer | mix | tok/s | p50 | p95 | TTFT p50 |", "|---|---|---|---|---|---|---|"]
    for i, turn in enumerate(rep["rounds"], 1):
        for peer, runs in turn.items():
            for mix, r in runs.items():
                lines.append(
                    f"| {i} | {peer} | {mix} | {r['tok_per_s']:.1f} | {r['latency_p50_s']:.2f}s | "
                    f"{r['latency_p95_s']:.2f}s | {r['ttft_p50_s']:.2f}s |"
                )
    return "\n".join(lines)


def render(rep: dict, out: Path, *, record: bool) -> None:
    from rich.console import Console
    from rich.markdown import Markdown

    w = rep["workload"]
    head = (
        f"loraplex vs vllm serve: {w['requests']} streamed chat requests per run, {w['concurrency']} concurrent, "
        f"{w['max_tokens']} tokens, max_loras {w['max_loras']}, {w['rounds']} rounds alternating "
        f"{' / '.join(rep['peers'])}"
    )
    body = "\n\n".join(
        [
            head,
            *(ratio_markdown(rep, p) for p in rep["comparisons"]),
            stages_markdown(rep),
            cpu_markdown(rep),
            "Every run:",
            runs_markdown(rep),
        ]
    )
    console = Console()
    console.print(Markdown(body))
    out.mkdir(parents=True, exist_ok=True)
    (out / "vs_vllm.json").write_text(json.dumps(rep, indent=2))
    _plot(rep, out / "vs_vllm.png")
    console.print(f"wrote {out / 'vs_vllm.json'} and {out / 'vs_vllm.png'}")
    if record:
        from benchmarks.results_log import record as append

        heading = append("bench_vs_vllm", body, ran_at=rep.get("commit"))
        console.print(f"recorded in benchmarks/RESULTS.md as: {heading}")


def _plot(rep: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mixes = list(rep["stages_ms"])
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    panels = (("tok_per_s", "tok/s"), ("latency_p50_s", "p50 latency (s)"), ("ttft_p50_s", "TTFT p50 (s)"))
    width = 0.8 / len(rep["peers"])
    for ax, (key, label) in zip(axes, panels, strict=True):
        for j, peer in enumerate(rep["peers"]):
            values = [[turn[peer][m][key] for turn in rep["rounds"]] for m in mixes]
            mids = [statistics.median(v) for v in values]
            errs = [
                [m - min(v) for m, v in zip(mids, values, strict=True)],
                [max(v) - m for m, v in zip(mids, values, strict=True)],
            ]
            xs = [i + (j - (len(rep["peers"]) - 1) / 2) * width for i in range(len(mixes))]
            ax.bar(xs, mids, width, yerr=errs, capsize=3, label=peer)
        ax.set_xticks(range(len(mixes)), [m.split(" (")[0] for m in mixes], fontsize=8)
        ax.set_ylabel(label)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
