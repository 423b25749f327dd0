"""`lpx simulate`: compare routing policies on a simulated worker cluster (the gateway's own router code)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from libs.routing.policies import POLICY_NAMES

ALL_POLICIES = ",".join(POLICY_NAMES)


def simulate_command(
    policies: str = typer.Option(ALL_POLICIES, help="Comma-separated routing policies to compare."),
    adapters: int = typer.Option(2000, min=2, help="Number of adapters."),
    top_k: int = typer.Option(100, min=1, help="Zipf skew: the top K adapters ..."),
    top_share: float = typer.Option(0.80, min=0.0, max=1.0, help="... carry this share of requests."),
    replicas: int = typer.Option(40, min=1, help="Worker replicas (one engine each)."),
    requests_per_s: float = typer.Option(500.0, min=0.001, help="Poisson arrival rate, requests/s."),
    duration_s: float = typer.Option(600.0, min=1.0, help="Measured simulated seconds."),
    warmup_s: float = typer.Option(60.0, min=0.0, help="Simulated seconds before measuring (caches fill)."),
    output_tokens: int = typer.Option(300, min=1, help="Output tokens per request."),
    engine_slots: int = typer.Option(100, min=1, help="GPU LoRA slots per replica (vLLM max_loras), LRU."),
    host_ram_gb: float = typer.Option(256.0, help="Host RAM per replica for the adapter cache, GB."),
    host_cache_adapters: int = typer.Option(None, help="Host cache size in adapters (default: what fits host RAM)."),
    adapter_bytes: int = typer.Option(None, help="Adapter size (default: Llama-3.1-8B rank 16, all modules, bf16)."),
    tok_s_per_replica: float = typer.Option(5000.0, help="Output tokens/s per replica, fully mixed batch."),
    max_running: int = typer.Option(64, min=1, help="Concurrent sequences per replica (batch limit)."),
    mixed_adapter_overhead: float = typer.Option(0.10, min=0.0, help="Slowdown of a fully mixed batch vs one adapter."),
    host_to_gpu_gb_s: float = typer.Option(25.0, help="Host RAM -> GPU bandwidth, GB/s."),
    fetch_min_s: float = typer.Option(0.5, help="Object-store fetch time, lowest, s."),
    fetch_max_s: float = typer.Option(1.5, help="Object-store fetch time, highest, s."),
    balance_factor: float = typer.Option(1.25, "--c", min=1.0001, help="Bounded load: skip workers over c x mean."),
    hot_threshold: int = typer.Option(None, min=1, help="Bounded load: in-flight per extra replica of a hot adapter."),
    max_spread: int = typer.Option(None, min=1, help="Bounded load: most replicas a hot adapter spreads over."),
    storm: bool = typer.Option(True, help="Also simulate the cold-start storm after a deploy, with/without prewarm."),
    storm_window_s: float = typer.Option(60.0, min=1.0, help="Seconds of the cold-start storm to measure."),
    prewarm_top: int = typer.Option(100, min=0, help="Adapters prewarmed on every replica in the storm variant."),
    placement: bool = typer.Option(
        True, help="Also simulate each replica pre-loading its ring share (the workers' placement), with churn."
    ),
    placement_fetch_per_s: float = typer.Option(10.0, min=0.01, help="Placement fetches per second per replica."),
    placement_successors: int = typer.Option(
        2, min=1, help="Ring positions of an adapter that pre-load it (the workers' LPX_WORKER_PLACEMENT_POSITIONS)."
    ),
    placement_demand: str = typer.Option(
        "active",
        help="What placement ranks a replica's share by: 'active' (as the workers: the requests seen so far, then "
        "every other active adapter), 'seen' (the requested ones alone) or 'oracle' (true popularity from the start).",
    ),
    disk_cache_adapters: int = typer.Option(
        0,
        min=0,
        help="Adapters a replica keeps on local disk (placement fills it); 0: no disk tier, placement fills host RAM.",
    ),
    churn_every_s: float = typer.Option(60.0, min=1, help="Placement with churn: a replica leaves, returns."),
    seed: int = typer.Option(0, help="Random seed (the same seed gives the same report)."),
    out: Path = typer.Option(None, help="Directory for report.json and PNG plots."),
    as_json: bool = typer.Option(False, "--json", help="Print the JSON report instead of tables."),
) -> None:
    """Simulate Zipf traffic over many adapters on a worker cluster and compare routing policies:
    adapter loads per 1,000 requests per tier, engine-slot hit rate, p50/p99 latency with load stalls,
    and max/mean replica load. Defaults are the reference deployment (BRIEF.md section 2)."""
    from rich.console import Console

    from libs.simulator.config import SimConfig
    from libs.simulator.output import (
        placement_table,
        run_with_progress,
        steady_table,
        storm_table,
        write_json,
        write_plots,
    )
    from libs.simulator.runner import validate_policies

    names = [p.strip() for p in policies.split(",") if p.strip()]
    optional = {"hot_threshold": hot_threshold, "max_spread": max_spread}
    try:
        config = SimConfig(
            adapters=adapters,
            top_k=top_k,
            top_share=top_share,
            requests_per_s=requests_per_s,
            duration_s=duration_s,
            warmup_s=warmup_s,
            output_tokens=output_tokens,
            replicas=replicas,
            engine_slots=engine_slots,
            host_ram_gb=host_ram_gb,
            host_cache_adapters=host_cache_adapters,
            adapter_bytes=adapter_bytes,
            tok_s_per_replica=tok_s_per_replica,
            max_running=max_running,
            mixed_adapter_overhead=mixed_adapter_overhead,
            host_to_gpu_gb_s=host_to_gpu_gb_s,
            fetch_s_min=fetch_min_s,
            fetch_s_max=fetch_max_s,
            balance_factor=balance_factor,
            storm_window_s=storm_window_s,
            prewarm_top=prewarm_top,
            placement_fetch_per_s=placement_fetch_per_s,
            placement_successors=placement_successors,
            placement_demand=placement_demand,
            disk_cache_adapters=disk_cache_adapters,
            churn_every_s=churn_every_s,
            seed=seed,
            **{k: v for k, v in optional.items() if v is not None},
        )
        names = validate_policies(names)  # unknown policies: a clear 400-style error before any work
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc

    console = Console(stderr=as_json)
    report = run_with_progress(config, names, storm, console, placement)
    if out is not None:
        written = [write_json(report, out / "report.json"), *write_plots(report, out)]
        console.print("wrote " + ", ".join(str(p) for p in written))
    if as_json:
        typer.echo(json.dumps(report.to_dict(), indent=2, default=str))
        return
    console.print(steady_table(report))
    if report.cold_start:
        console.print(storm_table(report))
    if report.placed:
        console.print(placement_table(report))
    console.print(f"simulated in {report.wall_s:.1f} s wall time")


def register(app: typer.Typer) -> None:
    app.command(
        "simulate",
        help=simulate_command.__doc__,
        short_help="Compare routing policies on a simulated cluster: loads, slot hits, latency, balance.",
    )(simulate_command)
