"""`lpx plan`: capacity, memory, load-time and cost figures derived from tensor shapes and the inputs.

Every number is computed here from `PlanInputs` and the base model's shapes; nothing is typed in.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from libs.lora.sizing import LoraSize, base_model_params, dtype_bytes, lora_size
from libs.planner.inputs import PlanInputs, load_base
from libs.planner.training import training_flops, training_gpu_hours
from libs.simulator.zipf import popularity, solve_zipf_exponent
from libs.tier_costs import GB


@dataclass(frozen=True)
class MemoryFigures:
    adapter_bytes: int
    all_adapters_bytes: int
    hot_set_bytes_per_gpu: int
    hot_set_fraction_of_gpu: float
    base_weights_bytes: int
    gpu_bytes_left_for_kv_cache: int
    host_ram_bytes: int
    all_fit_host_ram: bool
    adapters_fitting_host_ram: int
    adapters_not_fitting_host_ram: int
    bytes_not_fitting_host_ram: int
    # With adapter-affinity routing a worker only holds its ring share of the adapters.
    affinity_share_adapters_per_worker: int
    affinity_share_bytes_per_worker: int
    affinity_share_fits_host_ram: bool
    nvme_bytes: int
    overflow_fits_nvme: bool


@dataclass(frozen=True)
class LoadTimes:
    host_to_gpu_s: float
    nvme_to_host_s: float
    nvme_to_gpu_s: float
    object_store_to_gpu_s_min: float
    object_store_to_gpu_s_max: float


@dataclass(frozen=True)
class Capacity:
    output_tok_s: float
    gpus_at_full_load: float
    gpus_needed: int
    utilization: float
    requests_per_s_per_gpu: float
    zipf_exponent: float
    hot_set_traffic_share: float  # share of requests on the globally hottest `hot_adapters_per_gpu`
    top_adapter_traffic_share: float


@dataclass(frozen=True)
class Cost:
    hours_per_month: float
    monthly_cost: float
    cost_per_adapter_month: float
    cost_per_million_requests: float


@dataclass(frozen=True)
class Dedicated:
    """One deployment per tenant: at least one GPU each, more for tenants whose own traffic needs it."""

    gpus: int
    tenants_needing_more_than_one_gpu: int
    monthly_cost: float
    cost_ratio_vs_pool: float


@dataclass(frozen=True)
class UpgradeBudget:
    """Retraining every adapter when the base model changes, two ways, plus both pools side by side."""

    adapters: int
    assumed_gpu_hours_per_adapter: float
    assumed_gpu_hours: float
    assumed_cost: float
    base_params: int
    dataset_tokens_per_adapter: int
    flops_per_adapter: float
    flops_gpu_hours_per_adapter: float
    flops_gpu_hours: float
    flops_cost: float
    training_gpus: int
    # The FLOPs figure spread over the training GPUs: how long the old and new base pools both run.
    side_by_side_hours: float
    side_by_side_gpu_hours: float  # the second (new-base) pool, at full size, for that period
    side_by_side_cost: float
    assumptions: str


@dataclass(frozen=True)
class TokenCost:
    """What one million output tokens cost, pooled and with a dedicated GPU per tenant."""

    throughput_source: str  # "assumed" or "measured: <file>"
    pool_per_million_output_tokens: float
    dedicated_per_million_output_tokens: float
    dedicated_over_pool: float


@dataclass(frozen=True)
class Plan:
    name: str
    inputs: PlanInputs
    adapter: LoraSize
    memory: MemoryFigures
    load_times: LoadTimes
    capacity: Capacity
    cost: Cost
    dedicated: Dedicated
    upgrade: UpgradeBudget
    token_cost: TokenCost

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "inputs": asdict(self.inputs),
            "adapter": self.adapter.to_dict(),
            "memory": asdict(self.memory),
            "load_times": asdict(self.load_times),
            "capacity": asdict(self.capacity),
            "cost": asdict(self.cost),
            "dedicated": asdict(self.dedicated),
            "upgrade": asdict(self.upgrade),
            "token_cost": asdict(self.token_cost),
        }


def gpus_needed(output_tok_s: float, tok_s_per_gpu: float, target_utilization: float) -> int:
    # Round before the ceiling so that 30.000000000004 GPUs of float noise does not become 31.
    return max(1, math.ceil(round(output_tok_s / (tok_s_per_gpu * target_utilization), 9)))


def _memory(inputs: PlanInputs, adapter: LoraSize, base_weights: int, workers: int) -> MemoryFigures:
    each = adapter.bytes
    all_bytes = each * inputs.adapters
    host = int(inputs.host_ram_gb * GB)
    gpu = int(inputs.gpu_memory_gb * GB)
    hot = each * inputs.hot_adapters_per_gpu
    fitting = min(inputs.adapters, host // each)
    share = math.ceil(inputs.adapters / workers)
    overflow = all_bytes - fitting * each
    nvme = int(inputs.nvme_gb * GB)
    return MemoryFigures(
        adapter_bytes=each,
        all_adapters_bytes=all_bytes,
        hot_set_bytes_per_gpu=hot,
        hot_set_fraction_of_gpu=hot / gpu,
        base_weights_bytes=base_weights,
        gpu_bytes_left_for_kv_cache=gpu - base_weights - hot,
        host_ram_bytes=host,
        all_fit_host_ram=all_bytes <= host,
        adapters_fitting_host_ram=fitting,
        adapters_not_fitting_host_ram=inputs.adapters - fitting,
        bytes_not_fitting_host_ram=overflow,
        affinity_share_adapters_per_worker=share,
        affinity_share_bytes_per_worker=share * each,
        affinity_share_fits_host_ram=share * each <= host,
        nvme_bytes=nvme,
        overflow_fits_nvme=overflow <= nvme,
    )


def _load_times(inputs: PlanInputs, adapter: LoraSize) -> LoadTimes:
    to_gpu = adapter.bytes / (inputs.host_to_gpu_gb_s * GB)
    from_nvme = adapter.bytes / (inputs.nvme_gb_s * GB)
    return LoadTimes(
        host_to_gpu_s=to_gpu,
        nvme_to_host_s=from_nvme,
        nvme_to_gpu_s=from_nvme + to_gpu,
        object_store_to_gpu_s_min=inputs.object_store_fetch_s_min + to_gpu,
        object_store_to_gpu_s_max=inputs.object_store_fetch_s_max + to_gpu,
    )


def _dedicated(inputs: PlanInputs, shares: list[float], output_tok_s: float, pool_monthly: float) -> Dedicated:
    per_tenant = [
        gpus_needed(share * output_tok_s, inputs.tok_s_per_gpu, inputs.target_utilization) for share in shares
    ]
    gpus = sum(per_tenant)
    monthly = gpus * inputs.price_per_gpu_hour * inputs.hours_per_month
    return Dedicated(
        gpus=gpus,
        tenants_needing_more_than_one_gpu=sum(1 for g in per_tenant if g > 1),
        monthly_cost=monthly,
        cost_ratio_vs_pool=monthly / pool_monthly,
    )


def _upgrade(inputs: PlanInputs, base_params: int, pool_gpus: int) -> UpgradeBudget:
    price, n = inputs.price_per_gpu_hour, inputs.adapters
    assumed = n * inputs.assumed_gpu_hours_per_adapter
    flops = training_flops(base_params, inputs.dataset_tokens)
    per_adapter = training_gpu_hours(
        base_params,
        inputs.dataset_tokens,
        peak_flops=inputs.gpu_peak_flops,
        utilisation=inputs.training_utilization,
        overhead_s=inputs.job_overhead_s,
    )
    derived = n * per_adapter
    period = derived / inputs.training_gpus
    return UpgradeBudget(
        adapters=n,
        assumed_gpu_hours_per_adapter=inputs.assumed_gpu_hours_per_adapter,
        assumed_gpu_hours=assumed,
        assumed_cost=assumed * price,
        base_params=base_params,
        dataset_tokens_per_adapter=inputs.dataset_tokens,
        flops_per_adapter=flops,
        flops_gpu_hours_per_adapter=per_adapter,
        flops_gpu_hours=derived,
        flops_cost=derived * price,
        training_gpus=inputs.training_gpus,
        side_by_side_hours=period,
        side_by_side_gpu_hours=period * pool_gpus,
        side_by_side_cost=period * pool_gpus * price,
        assumptions=(
            f"assumed: {inputs.assumed_gpu_hours_per_adapter:g} GPU-h per adapter; FLOPs: 6 x {base_params:,} params x "
            f"{inputs.dataset_tokens:,} tokens at {inputs.training_utilization:.0%} of "
            f"{inputs.gpu_peak_flops / 1e12:,.0f} TFLOP/s + {inputs.job_overhead_s:g} s per job; side by side: "
            f"the FLOPs figure on {inputs.training_gpus} training GPUs while a second {pool_gpus}-GPU pool runs"
        ),
    )


def _token_cost(inputs: PlanInputs, output_tok_s: float, pool_gpus: int, dedicated_gpus: int) -> TokenCost:
    tokens_per_hour_millions = output_tok_s * 3600 / 1e6
    pool = pool_gpus * inputs.price_per_gpu_hour / tokens_per_hour_millions
    dedicated = dedicated_gpus * inputs.price_per_gpu_hour / tokens_per_hour_millions
    return TokenCost(
        throughput_source=inputs.throughput_source,
        pool_per_million_output_tokens=pool,
        dedicated_per_million_output_tokens=dedicated,
        dedicated_over_pool=dedicated / pool,
    )


def make_plan(inputs: PlanInputs | None = None, name: str = "reference") -> Plan:
    inputs = inputs or PlanInputs()
    spec, tied = load_base(inputs.base)
    if inputs.tied_embeddings is not None:
        tied = inputs.tied_embeddings
    adapter = lora_size(spec, inputs.rank, inputs.targets, inputs.dtype)
    base_params = base_model_params(spec, tied_embeddings=tied)
    base_weights = base_params * dtype_bytes(spec.dtype)

    output_tok_s = inputs.requests_per_s * inputs.output_tokens
    gpus = gpus_needed(output_tok_s, inputs.tok_s_per_gpu, inputs.target_utilization)
    exponent = solve_zipf_exponent(inputs.adapters, inputs.top_k, inputs.top_share)
    shares = popularity(inputs.adapters, exponent)
    capacity = Capacity(
        output_tok_s=output_tok_s,
        gpus_at_full_load=output_tok_s / inputs.tok_s_per_gpu,
        gpus_needed=gpus,
        utilization=output_tok_s / (gpus * inputs.tok_s_per_gpu),
        requests_per_s_per_gpu=inputs.requests_per_s / gpus,
        zipf_exponent=exponent,
        hot_set_traffic_share=math.fsum(shares[: inputs.hot_adapters_per_gpu]),
        top_adapter_traffic_share=shares[0],
    )
    monthly = gpus * inputs.price_per_gpu_hour * inputs.hours_per_month
    cost = Cost(
        hours_per_month=inputs.hours_per_month,
        monthly_cost=monthly,
        cost_per_adapter_month=monthly / inputs.adapters,
        cost_per_million_requests=gpus * inputs.price_per_gpu_hour / (inputs.requests_per_s * 3600) * 1e6,
    )
    dedicated = _dedicated(inputs, shares, output_tok_s, monthly)
    return Plan(
        name=name,
        inputs=inputs,
        adapter=adapter,
        memory=_memory(inputs, adapter, base_weights, gpus),
        load_times=_load_times(inputs, adapter),
        capacity=capacity,
        cost=cost,
        dedicated=dedicated,
        upgrade=_upgrade(inputs, base_params, gpus),
        token_cost=_token_cost(inputs, output_tok_s, gpus, dedicated.gpus),
    )


def make_variants(inputs: PlanInputs | None = None) -> list[Plan]:
    """The questions of BRIEF.md section 2: a rank-64 pool; many adapters with an NVMe tier; the same
    adapter count at attention-only low rank."""
    inputs = inputs or PlanInputs()
    many = inputs.variant_many_adapters
    return [
        make_plan(inputs.with_changes(rank=inputs.variant_large_rank), name=f"rank {inputs.variant_large_rank}"),
        make_plan(inputs.with_changes(adapters=many), name=f"{many:,} adapters + NVMe tier"),
        make_plan(
            inputs.with_changes(adapters=many, rank=inputs.variant_small_rank, targets=inputs.variant_small_targets),
            name=f"{many:,} adapters, {inputs.variant_small_targets}-only rank {inputs.variant_small_rank}",
        ),
    ]
