"""Reference-scale routing benchmark: every policy side by side on the same seeded traffic.

    python benchmarks/bench_simulator.py --out bench-results/

Reference scale (BRIEF.md section 2): 2,000 adapters (top 100 carry 80%), 40 replicas, 500 req/s,
10 simulated minutes measured (300,000 requests) after a 1-minute warm-up, plus the cold-start storm.
Prints the tables, writes report.json and PNG plots, and checks the acceptance criterion: bounded-load
consistent hashing makes >= 10x fewer adapter loads per 1,000 requests than random routing while no
assignment exceeds ceil(c x mean load). Exit status 1 if it does not.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console

from libs.routing import POLICY_NAMES
from libs.simulator.config import SimConfig
from libs.simulator.output import (
    placement_table,
    run_with_progress,
    steady_table,
    storm_table,
    write_json,
    write_plots,
)
from libs.simulator.runner import OUR_POLICY, Report

REQUIRED_RATIO = 10.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("bench-results"), help="output directory")
    parser.add_argument("--policies", default=",".join(POLICY_NAMES), help="comma-separated policies")
    parser.add_argument("--duration-s", type=float, default=600.0, help="measured simulated seconds")
    parser.add_argument("--adapters", type=int, default=2000, help="number of adapters")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-storm", action="store_true", help="skip the cold-start storm runs")
    return parser.parse_args(argv)


def run(config: SimConfig, policies: list[str], storm: bool, console: Console) -> Report:
    return run_with_progress(config, policies, storm, console)


def acceptance(report: Report, console: Console) -> bool:
    ratio = report.load_ratio()
    ours = report.steady.get(OUR_POLICY)
    if ratio is None or ours is None:
        console.print("acceptance check skipped: needs both random and bounded_load")
        return True
    within_bound = ours["bound_violations"] == 0 and ours["max_bound_use"] <= 1.0
    passed = ratio >= REQUIRED_RATIO and within_bound
    console.print(
        f"random / bounded_load loads per 1,000 requests: {ratio:,.1f}x (need >= {REQUIRED_RATIO:g}x); "
        f"bounded_load max/mean load {ours['max_over_mean_load']:.3f} sampled, "
        f"{ours['assigned_load_ratio_max']:.3f} worst at assignment, "
        f"{ours['bound_violations']} assignments over ceil({report.config.balance_factor:g} x mean): "
        + ("[green]PASS[/green]" if passed else "[red]FAIL[/red]")
    )
    return passed


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console()
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    config = SimConfig(duration_s=args.duration_s, adapters=args.adapters, seed=args.seed)
    started = time.perf_counter()
    report = run(config, policies, storm=not args.no_storm, console=console)
    wall = time.perf_counter() - started
    console.print(steady_table(report))
    if report.cold_start:
        console.print(storm_table(report))
    if report.placed:
        console.print(placement_table(report))
    written = [write_json(report, args.out / "report.json"), *write_plots(report, args.out)]
    console.print("wrote " + ", ".join(str(p) for p in written))
    for name, summary in report.steady.items():
        console.print(f"  {name}: {summary['requests']:,} requests simulated in {summary['wall_s']:.1f} s")
    console.print(f"wall time, all runs: {wall:.1f} s")
    return 0 if acceptance(report, console) else 1


if __name__ == "__main__":
    sys.exit(main())
