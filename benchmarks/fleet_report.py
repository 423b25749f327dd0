"""bench_fleet's report: the table (measured | simulator | ratio per policy), what the simulator predicts
without placement and with the measured hand-offs, every error and bound violation explained, the fault
run; then the JSON and the plot in --out."""

from __future__ import annotations

import json
import sys
from pathlib import Path

FIGURES = (
    ("loads_per_1000", "loads/1k", "{:.1f}"),
    ("cold_loads_per_1000", "cold/1k", "{:.1f}"),
    ("object_fetches_per_1000", "S3/1k", "{:.1f}"),
    ("slot_hit_rate", "slot hits", "{:.2f}"),
    ("assigned_load_ratio_max", "max/mean", "{:.2f}"),
    ("bound_violations", "bound viol.", "{:.0f}"),
    ("bound_violations_at_worker", "viol. at worker", "{:.0f}"),
    ("passed_on_per_1000", "passed on/1k", "{:.1f}"),
    ("kept_over_bound", "kept over", "{:.0f}"),
    ("latency_p50_s", "p50 s", "{:.2f}"),
    ("latency_p99_s", "p99 s", "{:.2f}"),
)


def render(report: dict, out: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 200)  # a log file: the whole table, unwrapped
    c = report["config"]
    table = Table(
        title=f"fleet: {c['gateways']} gateways, {c['workers']} simulated workers, {c['adapters']} "
        f"adapters, {c['rate']} req/s Zipf (measured | simulator, placed as the workers place | ratio)"
    )
    table.add_column("policy")
    for _, label, _fmt in FIGURES:
        table.add_column(label, justify="right")
    for policy, m in report["measured"].items():
        p = report["predicted"].get(policy, {})
        cells = []
        for key, _label, fmt in FIGURES:
            ratio = m[key] / p[key] if p.get(key) else float("nan")
            cells.append(f"{fmt.format(m[key])} | {fmt.format(p.get(key, float('nan')))} | {ratio:.2f}")
        table.add_row(policy, *cells)
    console.print(table)
    for policy, p in report.get("predicted_without_placement", {}).items():
        console.print(
            f"simulator without placement, {policy}: cold/1k {p['cold_loads_per_1000']:.1f}, "
            f"S3/1k {p['object_fetches_per_1000']:.1f}"
        )
    for policy, p in report.get("predicted_with_handoffs", {}).items():
        console.print(
            f"simulator with the workers' hand-offs measured ({p['passed_on_per_1000']:.1f}/1k, at the bound), "
            f"{policy}: loads/1k {p['loads_per_1000']:.1f}, cold/1k {p['cold_loads_per_1000']:.1f}, "
            f"S3/1k {p['object_fetches_per_1000']:.1f}, p99 {p['latency_p99_s']:.2f} s"
        )
    for policy, m in report["measured"].items():
        for reason, count in m.get("error_reasons", {}).items():
            console.print(f"{policy}: {count} answered with an error: {reason}")
        for v in m.get("bound_violation_details_at_worker", []):
            console.print(
                f"{policy}: {v['worker']} took a request over the bound ({v['load_after']} > {v['bound']}, "
                f"{v['pool_in_flight']} in flight); another worker answered {v['ms_since_another_worker_answered']} ms "
                f"before (bound with one more in flight: {v['bound_one_more_in_flight']})"
            )
    f = report["faults"]
    if f:
        console.print(
            f"fault run (bounded_load, 1 gateway + {c['workers'] // 4} workers SIGKILLed mid-run): "
            f"{f['submissions']} submissions, lost {f['lost']}, duplicated {f['duplicated']}"
            + "".join(f"\n  lost: {reason}" for reason in f["lost_reasons"])
        )
    out.mkdir(parents=True, exist_ok=True)
    (out / "fleet.json").write_text(json.dumps(report, indent=2, default=str))
    _plot(report, out / "fleet.png")
    console.print(f"wrote {out / 'fleet.json'} and {out / 'fleet.png'}")


def _plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    policies = list(report["measured"])
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    for ax, (key, label, _fmt) in zip(axes, FIGURES[:3], strict=True):
        xs = range(len(policies))
        ax.bar([x - 0.2 for x in xs], [report["measured"][p][key] for p in policies], 0.4, label="measured")
        ax.bar(
            [x + 0.2 for x in xs],
            [report["predicted"].get(p, {}).get(key, 0) for p in policies],
            0.4,
            label="simulator",
        )
        ax.set_xticks(list(xs), policies, fontsize=8)
        ax.set_ylabel(label)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
