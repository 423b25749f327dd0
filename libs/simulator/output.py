"""Report rendering: rich tables for people, JSON for machines, PNG plots (matplotlib, Agg backend)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from rich.table import Table

from libs.simulator.runner import Report


def _fmt(value: float, digits: int = 2) -> str:
    return "inf" if math.isinf(value) else f"{value:,.{digits}f}"


POLICY_HEADERS = {
    "random": "random",
    "least_loaded": "least\nloaded",
    "consistent_hash": "consist.\nhash",
    "bounded_load": "bounded\nload",
    "gie_lora_affinity": "GIE LoRA\naffinity",
    "ray_multiplex": "Ray\nmultiplex",
}

STEADY_ROWS: tuple[tuple[str, str, str], ...] = (
    # (label, summary key, format)
    ("loads / 1k req", "loads_per_1000", "num"),
    (" host->GPU / 1k", "host_loads_per_1000", "num"),
    (" cold / 1k", "cold_loads_per_1000", "num"),
    ("slot hit rate", "slot_hit_rate", "pct"),
    ("p50 s", "latency_p50_s", "num"),
    ("p99 s", "latency_p99_s", "num"),
    ("wait p99 s", "wait_p99_s", "num"),
    ("max/mean load", "max_over_mean_load", "ratio"),
    ("max/mean worst", "max_over_mean_load_peak", "ratio"),
    ("over bound", "bound_violations", "int"),
    ("replicas top-1", "replicas_serving_hottest_adapter", "int"),
    ("replicas/adapter", "replicas_per_adapter_weighted", "num"),
)

STORM_ROWS: tuple[tuple[str, str, str, str], ...] = (
    ("cold fetches", "cold_start", "cold_loads", "int"),
    ("cold / 1k", "cold_start", "cold_loads_per_1000", "num"),
    ("p99 s", "cold_start", "latency_p99_s", "num"),
    ("wait p99 s", "cold_start", "wait_p99_s", "num"),
    ("warm: cold fetches", "cold_start_prewarmed", "cold_loads", "int"),
    ("warm: cold / 1k", "cold_start_prewarmed", "cold_loads_per_1000", "num"),
    ("warm: p99 s", "cold_start_prewarmed", "latency_p99_s", "num"),
    ("warm: wait p99 s", "cold_start_prewarmed", "wait_p99_s", "num"),
)


def _cell(value: float, kind: str) -> str:
    if kind == "pct":
        return f"{value:.2%}"
    if kind == "int":
        return f"{int(value):,}"
    if kind == "ratio":
        return _fmt(value, 3)
    return _fmt(value)


def _policy_table(title: str, policies: list[str]) -> Table:
    """Policies as columns and figures as rows, so six policies fit an 80-column terminal."""
    table = Table(title=title)
    table.add_column("figure", no_wrap=True)
    for name in policies:
        table.add_column(POLICY_HEADERS.get(name, name), justify="right")
    return table


def steady_table(report: Report) -> Table:
    cfg = report.config
    table = _policy_table(
        f"Steady state: {cfg.adapters:,} adapters (Zipf s={report.zipf_exponent:.3f}), "
        f"{cfg.replicas} replicas, "
        f"{cfg.requests_per_s:g} req/s, {cfg.duration_s:g} s measured after {cfg.warmup_s:g} s warm-up",
        list(report.steady),
    )
    for label, key, kind in STEADY_ROWS:
        table.add_row(label, *(_cell(s[key], kind) for s in report.steady.values()))
    ratio = report.load_ratio()
    caption = (
        f"load = in-flight requests per replica; bound = ceil({cfg.balance_factor:g} x mean) at assignment; "
        f"max/mean sampled every {cfg.sample_interval_s:g} s"
    )
    if ratio is not None:
        caption = f"random / bounded_load adapter loads per 1,000 requests: {_fmt(ratio, 1)}x. " + caption
    table.caption = caption
    return table


def storm_table(report: Report) -> Table:
    cfg = report.config
    table = _policy_table(
        f"Cold-start storm: caches empty, first {cfg.storm_window_s:g} s after a deploy; "
        f"warm = top {cfg.prewarm_top} adapters put on every replica first",
        list(report.cold_start),
    )
    for label, scenario, key, kind in STORM_ROWS:
        runs = getattr(report, scenario)
        table.add_row(label, *(_cell(runs[name][key], kind) if name in runs else "-" for name in report.cold_start))
    return table


PLACEMENT_ROWS: tuple[tuple[str, str, str, str], ...] = (
    ("cold / 1k: none", "steady", "cold_loads_per_1000", "num"),
    ("cold / 1k: placed", "placed", "cold_loads_per_1000", "num"),
    ("cold / 1k: + churn", "placed_churn", "cold_loads_per_1000", "num"),
    ("p99 s: none", "steady", "latency_p99_s", "num"),
    ("p99 s: placed", "placed", "latency_p99_s", "num"),
    ("p99 s: + churn", "placed_churn", "latency_p99_s", "num"),
    ("placement fetches", "placed", "placement_fetches", "int"),
    ("  with churn", "placed_churn", "placement_fetches", "int"),
)


def placement_table(report: Report) -> Table:
    cfg = report.config
    table = _policy_table(
        f"Placement: each replica pre-loads its ring share ({cfg.placement_fetch_per_s:g} fetches/s, "
        f"{cfg.placement_successors} ring position(s)); churn: a replica leaves and returns every "
        f"{cfg.churn_every_s:g} s",
        list(report.placed),
    )
    for label, scenario, key, kind in PLACEMENT_ROWS:
        runs = getattr(report, scenario)
        table.add_row(label, *(_cell(runs[name][key], kind) if name in runs else "-" for name in report.placed))
    table.caption = "cold = object-store fetches a request waits for, per 1,000 measured requests (after warm-up)"
    return table


def write_json(report: Report, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report.to_dict(), indent=2, default=str))
    return path


def write_plots(report: Report, out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    written = [
        _plot_loads(plt, report, out_dir),
        _plot_latency(plt, report, out_dir),
        _plot_balance(plt, report, out_dir),
    ]
    if report.cold_start:
        written.append(_plot_storm(plt, report, out_dir))
    return written


def _plot_loads(plt, report: Report, out_dir: Path) -> Path:
    names = list(report.steady)
    host = [report.steady[n]["host_loads_per_1000"] for n in names]
    cold = [report.steady[n]["cold_loads_per_1000"] for n in names]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    ax.bar(names, host, label="host RAM -> GPU slot")
    ax.bar(names, cold, bottom=host, label="object store (cold)")
    ax.set_yscale("symlog", linthresh=1.0)
    ax.set_ylabel("adapter loads per 1,000 requests")
    ax.set_title("Adapter loads by tier (steady state)")
    ax.legend()
    ax.tick_params(axis="x", rotation=20)
    return _save(plt, fig, out_dir / "loads_per_1000.png")


def _plot_latency(plt, report: Report, out_dir: Path) -> Path:
    names = list(report.steady)
    width = 0.38
    xs = range(len(names))
    fig, ax = plt.subplots(figsize=(9, 4.5))
    ax.bar([x - width / 2 for x in xs], [report.steady[n]["latency_p50_s"] for n in names], width, label="p50")
    ax.bar([x + width / 2 for x in xs], [report.steady[n]["latency_p99_s"] for n in names], width, label="p99")
    ax.set_xticks(list(xs), names, rotation=20)
    ax.set_yscale("log")
    ax.set_ylabel("end-to-end latency, s (load stalls included)")
    ax.set_title("Request latency (steady state)")
    ax.legend()
    return _save(plt, fig, out_dir / "latency.png")


def _plot_balance(plt, report: Report, out_dir: Path) -> Path:
    names = list(report.steady)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    ax.bar(names, [report.steady[n]["max_over_mean_load"] for n in names])
    ax.axhline(
        report.config.balance_factor,
        color="red",
        linestyle="--",
        label=f"c = {report.config.balance_factor:g}",
    )
    ax.set_yscale("log")
    ax.set_ylabel("max / mean in-flight load")
    ax.set_title("Load balance across replicas (sampled)")
    ax.legend()
    ax.tick_params(axis="x", rotation=20)
    return _save(plt, fig, out_dir / "load_balance.png")


def _plot_storm(plt, report: Report, out_dir: Path) -> Path:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
    for ax, runs, title in (
        (axes[0], report.cold_start, "empty caches"),
        (axes[1], report.cold_start_prewarmed, f"top {report.config.prewarm_top} prewarmed"),
    ):
        for name, summary in runs.items():
            ax.plot(summary["cold_loads_per_s"], label=name)
        ax.set_title(f"Cold-start storm: {title}")
        ax.set_xlabel("seconds after deploy")
        ax.set_yscale("symlog", linthresh=1.0)
    axes[0].set_ylabel("object-store fetches per second")
    axes[1].legend(fontsize="small")
    return _save(plt, fig, out_dir / "cold_start.png")


def _save(plt, fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run_with_progress(config, policies, storm: bool, console, placement: bool = True):
    """run_comparison behind a progress bar (one step per simulated run); used by the CLI and the bench."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from libs.simulator.runner import run_comparison, runs_in

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("simulating", total=runs_in(policies, storm, placement))
        return run_comparison(
            config,
            policies,
            storm=storm,
            placement=placement,
            progress=lambda done: bar.update(task, advance=1, description=done),
        )
