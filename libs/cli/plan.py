"""`lpx plan`: capacity planner. Every figure derives from the base model's tensor shapes and inputs."""

from __future__ import annotations

import json
from pathlib import Path

import typer

_DEFAULTS_NOTE = "Defaults are the reference deployment (BRIEF.md section 2)."


def _gb(value: float) -> str:
    return f"{value / 1e9:,.2f} GB"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f} ms"


def _main_table(plan):
    from rich.table import Table

    i, m, cap, cost, ded, lt = (
        plan.inputs,
        plan.memory,
        plan.capacity,
        plan.cost,
        plan.dedicated,
        plan.load_times,
    )
    table = Table(
        title=f"Plan: {plan.adapter.base}, rank {i.rank} on {', '.join(plan.adapter.targets)}, {plan.adapter.dtype}",
        show_header=False,
    )
    table.add_column("figure")
    table.add_column("value", justify="right")
    rows = [
        ("adapter parameters", f"{plan.adapter.params:,}"),
        ("adapter size", f"{plan.adapter.bytes:,} B ({plan.adapter.bytes / 2**20:,.1f} MiB)"),
        (f"all {i.adapters:,} adapters", _gb(m.all_adapters_bytes)),
        (
            f"hot set per GPU ({i.hot_adapters_per_gpu} adapters)",
            f"{_gb(m.hot_set_bytes_per_gpu)} ({m.hot_set_fraction_of_gpu:.1%} of {i.gpu_memory_gb:g} GB)",
        ),
        ("base weights per GPU", _gb(m.base_weights_bytes)),
        ("GPU memory left for KV cache", _gb(m.gpu_bytes_left_for_kv_cache)),
        (
            f"host RAM per worker ({i.host_ram_gb:g} GB) holds",
            f"{m.adapters_fitting_host_ram:,} adapters"
            + ("" if m.all_fit_host_ram else f"; {m.adapters_not_fitting_host_ram:,} do not fit"),
        ),
        (
            "affinity share per worker",
            f"{m.affinity_share_adapters_per_worker:,} adapters = {_gb(m.affinity_share_bytes_per_worker)}",
        ),
        ("load: host RAM -> GPU", _ms(lt.host_to_gpu_s)),
        ("load: local NVMe -> GPU", _ms(lt.nvme_to_gpu_s)),
        (
            "load: object store -> GPU",
            f"{lt.object_store_to_gpu_s_min:.2f}-{lt.object_store_to_gpu_s_max:.2f} s",
        ),
        ("output tokens/s needed", f"{cap.output_tok_s:,.0f}"),
        ("GPUs at 100% busy", f"{cap.gpus_at_full_load:,.2f}"),
        (
            f"GPUs needed (<= {i.target_utilization:.0%} busy)",
            f"{cap.gpus_needed:,} ({cap.utilization:.1%} busy)",
        ),
        ("Zipf exponent", f"{cap.zipf_exponent:.4f} (top {i.top_k} carry {i.top_share:.0%})"),
        ("traffic on the global hot set", f"{cap.hot_set_traffic_share:.1%}"),
        (
            "monthly cost (pool)",
            f"${cost.monthly_cost:,.0f} ({cost.hours_per_month:g} h x ${i.price_per_gpu_hour:g})",
        ),
        ("cost per adapter-month", f"${cost.cost_per_adapter_month:,.2f}"),
        ("dedicated GPU per tenant", f"{ded.gpus:,} GPUs, ${ded.monthly_cost:,.0f}/month"),
        ("dedicated / pool", f"{ded.cost_ratio_vs_pool:,.1f}x"),
        *_token_cost_rows(plan),
        *_upgrade_rows(plan),
    ]
    for name, value in rows:
        table.add_row(name, value)
    return table


def _token_cost_rows(plan) -> list[tuple[str, str]]:
    t = plan.token_cost
    return [
        (f"per 1M output tokens, pool ({t.throughput_source} throughput)", f"${t.pool_per_million_output_tokens:,.3f}"),
        (
            f"per 1M output tokens, dedicated GPU per tenant ({t.throughput_source})",
            f"${t.dedicated_per_million_output_tokens:,.3f} ({t.dedicated_over_pool:,.1f}x)",
        ),
    ]


def _upgrade_rows(plan) -> list[tuple[str, str]]:
    u, i = plan.upgrade, plan.inputs
    return [
        (
            f"base upgrade: retrain {u.adapters:,} adapters (assumed {u.assumed_gpu_hours_per_adapter:g} GPU-h each)",
            f"{u.assumed_gpu_hours:,.0f} GPU-h, ${u.assumed_cost:,.0f}",
        ),
        (
            f"base upgrade: retrain (FLOPs: 6 x params x {u.dataset_tokens_per_adapter:,} tokens, "
            f"{i.training_utilization:.0%} util.)",
            f"{u.flops_gpu_hours:,.0f} GPU-h, ${u.flops_cost:,.0f} ({u.flops_gpu_hours_per_adapter:.3f} GPU-h each)",
        ),
        (
            f"base upgrade: both pools side by side ({u.training_gpus} training GPUs)",
            f"{u.side_by_side_hours:,.1f} h -> {u.side_by_side_gpu_hours:,.0f} GPU-h, ${u.side_by_side_cost:,.0f}",
        ),
    ]


def _variants_table(plans):
    """Variants as columns, figures as rows: fits a terminal even with long answers."""
    from rich.table import Table

    table = Table(title="Variants")
    table.add_column("figure")
    for plan in plans:
        table.add_column(plan.name, justify="right")

    def fits_host(plan) -> str:
        m = plan.memory
        if m.all_fit_host_ram:
            return "yes"
        return f"no: {m.adapters_not_fitting_host_ram:,} adapters, {_gb(m.bytes_not_fitting_host_ram)}"

    rows = [
        ("adapter size", lambda p: f"{p.adapter.bytes / 1e6:,.1f} MB"),
        ("all adapters", lambda p: _gb(p.memory.all_adapters_bytes)),
        ("all fit host RAM?", fits_host),
        (
            "overflow fits NVMe?",
            lambda p: "n/a" if p.memory.all_fit_host_ram else ("yes" if p.memory.overflow_fits_nvme else "no"),
        ),
        (
            "affinity share / worker",
            lambda p: (
                f"{p.memory.affinity_share_adapters_per_worker:,} = {_gb(p.memory.affinity_share_bytes_per_worker)}"
            ),
        ),
        (
            "hot set / GPU",
            lambda p: f"{_gb(p.memory.hot_set_bytes_per_gpu)} ({p.memory.hot_set_fraction_of_gpu:.1%})",
        ),
        ("GPU left for KV cache", lambda p: _gb(p.memory.gpu_bytes_left_for_kv_cache)),
        ("host RAM -> GPU", lambda p: _ms(p.load_times.host_to_gpu_s)),
        ("NVMe -> GPU", lambda p: _ms(p.load_times.nvme_to_gpu_s)),
        ("GPUs / monthly", lambda p: f"{p.capacity.gpus_needed:,} / ${p.cost.monthly_cost:,.0f}"),
        ("per adapter-month", lambda p: f"${p.cost.cost_per_adapter_month:,.2f}"),
        ("dedicated / pool", lambda p: f"{p.dedicated.cost_ratio_vs_pool:,.1f}x"),
        ("per 1M output tokens, pool", lambda p: f"${p.token_cost.pool_per_million_output_tokens:,.3f}"),
        ("per 1M output tokens, dedicated", lambda p: f"${p.token_cost.dedicated_per_million_output_tokens:,.3f}"),
        (
            "upgrade: assumed / FLOPs GPU-h",
            lambda p: f"{p.upgrade.assumed_gpu_hours:,.0f} / {p.upgrade.flops_gpu_hours:,.0f}",
        ),
        ("upgrade: FLOPs cost", lambda p: f"${p.upgrade.flops_cost:,.0f}"),
        ("upgrade: side by side", lambda p: f"{p.upgrade.side_by_side_gpu_hours:,.0f} GPU-h"),
    ]
    for name, cell in rows:
        table.add_row(name, *(cell(plan) for plan in plans))
    return table


def plan_command(
    base: str = typer.Option("llama-3.1-8b", help="Catalog preset (llama-3.1-8b, smollm2-135m) or a config.json path."),
    rank: int = typer.Option(16, min=1, help="LoRA rank r."),
    targets: str = typer.Option("all", help="Target modules: all, attention, mlp, or a list like q,k,v,o."),
    dtype: str = typer.Option(None, help="Adapter dtype (default: the base model's dtype)."),
    adapters: int = typer.Option(2000, min=1, help="Number of adapters (tenants)."),
    top_k: int = typer.Option(100, min=1, help="Traffic skew: the top K adapters ..."),
    top_share: float = typer.Option(0.80, min=0.0, max=1.0, help="... carry this share of requests (Zipf)."),
    requests_per_s: float = typer.Option(500.0, min=0.0, help="Requests per second, all tenants."),
    output_tokens: int = typer.Option(300, min=1, help="Output tokens per request."),
    tok_s_per_gpu: float = typer.Option(5000.0, min=0.0, help="Output tokens/s per GPU at SLO, LoRA overhead in."),
    target_utilization: float = typer.Option(0.75, min=0.01, max=1.0, help="Headroom: keep GPUs at most this busy."),
    price: float = typer.Option(
        2.50, "--gpu-hour-usd", "--price-per-gpu-hour", min=0.0, help="GPU price per hour (USD)."
    ),
    hot_per_gpu: int = typer.Option(100, "--hot-per-gpu", min=1, help="Hot adapters kept in GPU slots per GPU."),
    gpu_memory_gb: float = typer.Option(80.0, help="GPU memory, GB."),
    host_to_gpu_gb_s: float = typer.Option(25.0, help="Host RAM -> GPU copy bandwidth, GB/s."),
    fetch_min_s: float = typer.Option(0.5, help="Object-store fetch time per adapter, lowest, s."),
    fetch_max_s: float = typer.Option(1.5, help="Object-store fetch time per adapter, highest, s."),
    nvme_gb_s: float = typer.Option(7.0, help="Local NVMe read bandwidth, GB/s."),
    host_ram_gb: float = typer.Option(256.0, help="Host RAM per worker for the adapter cache, GB."),
    nvme_gb: float = typer.Option(3840.0, help="Local NVMe per worker for the adapter disk tier, GB."),
    hours_per_adapter: float = typer.Option(
        0.5, min=0.0, help="Base upgrade, assumed figure: GPU-hours to retrain one adapter."
    ),
    dataset_tokens: int = typer.Option(
        2_000_000, min=1, help="Base upgrade, FLOPs figure: tokens trained per adapter (epochs included)."
    ),
    training_utilization: float = typer.Option(
        0.35, min=0.01, max=1.0, help="Base upgrade, FLOPs figure: model FLOPs utilisation of training."
    ),
    training_gpus: int = typer.Option(8, min=1, help="GPUs retraining at once (how long both base pools run)."),
    measured_bench: Path = typer.Option(
        None,
        exists=True,
        dir_okay=False,
        help="Use the measured mixed-adapter tok/s of `make bench` (bench-results/worker.json) instead of "
        "--tok-s-per-gpu; figures are then labelled measured.",
    ),
    variants: bool = typer.Option(True, help="Also answer the variants (rank 64; 20,000 adapters; attention r8)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
) -> None:
    """Size a LoRA pool: adapter bytes from tensor shapes, memory per tier, load times, GPUs, monthly cost,
    cost per 1M output tokens, the dedicated-GPU-per-tenant comparison, and the budget of a base-model
    upgrade (retraining every adapter: an assumed and a FLOPs-derived figure, and both pools side by side)."""
    from rich.console import Console

    from libs.planner import PlanInputs, make_plan, make_variants
    from libs.planner.inputs import measured_tok_s_per_gpu

    try:
        source = "assumed"
        if measured_bench is not None:
            tok_s_per_gpu = measured_tok_s_per_gpu(measured_bench)
            source = f"measured: {measured_bench.name}"
        inputs = PlanInputs(
            base=base,
            rank=rank,
            targets=targets,
            dtype=dtype,
            adapters=adapters,
            top_k=top_k,
            top_share=top_share,
            requests_per_s=requests_per_s,
            output_tokens=output_tokens,
            tok_s_per_gpu=tok_s_per_gpu,
            target_utilization=target_utilization,
            price_per_gpu_hour=price,
            hot_adapters_per_gpu=hot_per_gpu,
            gpu_memory_gb=gpu_memory_gb,
            host_to_gpu_gb_s=host_to_gpu_gb_s,
            object_store_fetch_s_min=fetch_min_s,
            object_store_fetch_s_max=fetch_max_s,
            nvme_gb_s=nvme_gb_s,
            host_ram_gb=host_ram_gb,
            nvme_gb=nvme_gb,
            assumed_gpu_hours_per_adapter=hours_per_adapter,
            dataset_tokens=dataset_tokens,
            training_utilization=training_utilization,
            training_gpus=training_gpus,
            throughput_source=source,
        )
        plan = make_plan(inputs)
        others = make_variants(inputs) if variants else []
    except (ValueError, KeyError) as exc:
        raise typer.BadParameter(str(exc)) from exc
    if as_json:
        typer.echo(json.dumps({"plan": plan.to_dict(), "variants": [p.to_dict() for p in others]}, indent=2))
        return
    console = Console()
    console.print(_main_table(plan))
    if others:
        console.print(_variants_table(others))


def register(app: typer.Typer) -> None:
    app.command(
        "plan",
        help=plan_command.__doc__ + " " + _DEFAULTS_NOTE,
        short_help="Capacity planner: adapter sizes, memory per tier, load times, GPUs and cost, from shapes.",
    )(plan_command)
