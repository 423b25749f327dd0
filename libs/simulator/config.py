"""Simulation inputs. Defaults are the reference deployment of BRIEF.md section 2."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from functools import cached_property

from libs.lora.sizing import lora_size
from libs.models.catalog import LLAMA_31_8B
from libs.routing import DEFAULT_BALANCE_FACTOR, DEFAULT_HOT_THRESHOLD, DEFAULT_MAX_SPREAD, DEFAULT_VNODES
from libs.tier_costs import GB, HOST_TO_GPU_GB_S, OBJECT_STORE_FETCH_S_MAX, OBJECT_STORE_FETCH_S_MIN


def reference_adapter_bytes() -> int:
    """Rank 16 on all seven projections of Llama-3.1-8B in bf16, from the shapes."""
    return lora_size(LLAMA_31_8B, 16, "all").bytes


@dataclass(frozen=True)
class SimConfig:
    # Traffic: Zipf over `adapters` with the top `top_k` carrying `top_share`; Poisson arrivals.
    adapters: int = 2000
    top_k: int = 100
    top_share: float = 0.80
    requests_per_s: float = 500.0
    duration_s: float = 600.0  # the measured window
    warmup_s: float = 60.0  # simulated before the window (caches fill), not measured
    output_tokens: int = 300
    # Cluster.
    replicas: int = 40
    engine_slots: int = 100  # GPU LoRA slots per replica (vLLM max_loras): the hot set
    host_ram_gb: float = 256.0  # host RAM per replica for the adapter cache
    host_cache_adapters: int | None = None  # None: as many adapters as fit `host_ram_gb`
    adapter_bytes: int | None = None  # None: the reference adapter's size from its shapes
    # Service model: a replica decodes `max_running` sequences at once and `tok_s_per_replica` in total
    # when every sequence in the batch uses a different adapter (the measured figure, LoRA overhead in);
    # a batch with fewer distinct adapters runs up to `mixed_adapter_overhead` faster.
    tok_s_per_replica: float = 5000.0
    max_running: int = 64
    mixed_adapter_overhead: float = 0.10
    # Tier latencies.
    host_to_gpu_gb_s: float = HOST_TO_GPU_GB_S
    fetch_s_min: float = OBJECT_STORE_FETCH_S_MIN
    fetch_s_max: float = OBJECT_STORE_FETCH_S_MAX
    # Bounded-load router.
    balance_factor: float = DEFAULT_BALANCE_FACTOR
    vnodes: int = DEFAULT_VNODES
    hot_threshold: int = DEFAULT_HOT_THRESHOLD
    max_spread: int = DEFAULT_MAX_SPREAD
    # Cold-start storm after a deploy: every cache empty, measured over the first `storm_window_s`.
    storm_window_s: float = 60.0
    prewarm_top: int = 100
    # Placement (the workers' ring-share pre-load): fetches per second per replica, and how many ring
    # positions of each adapter pre-load it (1: its owner only; 2: also the next, where the bound spills it,
    # as the workers do by default: LPX_WORKER_PLACEMENT_POSITIONS).
    placement_fetch_per_s: float = 10.0
    placement_successors: int = 2
    # What placement ranks the share by (libs/simulator/placement.py): "active" (as the workers do: the
    # requests seen so far, then every other active adapter), "seen" (the requested ones alone) or "oracle"
    # (the true popularity from the start: the bound).
    placement_demand: str = "active"
    placement_interval_s: float = 10.0
    # Local disk tier per replica (LRU, in adapters): placement fills it, and a fetched adapter lands there
    # too; a load from disk takes `disk_load_s`. 0: no disk tier, placement fills host RAM and every load
    # from outside host RAM is an object-store fetch (the reference deployment: the share fits host RAM).
    disk_cache_adapters: int = 0
    disk_load_s: float = 0.005
    # The workers' own check of the load bound (services/worker/load_bound.py) passes a share of requests
    # on to the pool's shared subject, where whoever pulls it within the bound runs it, away from the
    # adapter's ring. Why (the gateways see each other's choices a few ms late) is not modelled: the
    # share is an input (bench_fleet feeds the one it measured), taken from the requests that fill their
    # worker to the bound (those two gateways choosing at once would overfill).
    handoff_share: float = 0.0
    churn_every_s: float = 60.0  # the churn scenario: a replica leaves, and comes back half a period later
    sample_interval_s: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.replicas < 1 or self.engine_slots < 1 or self.max_running < 1:
            raise ValueError("replicas, engine_slots and max_running must be >= 1")
        if self.requests_per_s <= 0 or self.duration_s <= 0 or self.warmup_s < 0:
            raise ValueError("requests_per_s and duration_s must be > 0, warmup_s >= 0")
        if self.fetch_s_min > self.fetch_s_max:
            raise ValueError("fetch_s_min must be <= fetch_s_max")
        if self.placement_demand not in ("active", "seen", "oracle"):
            raise ValueError("placement_demand must be 'active', 'seen' or 'oracle'")
        if not 0.0 <= self.handoff_share < 1.0:
            raise ValueError("handoff_share must be in [0, 1)")
        if self.placement_interval_s <= 0 or self.disk_cache_adapters < 0:
            raise ValueError("placement_interval_s must be > 0, disk_cache_adapters >= 0")

    def with_changes(self, **changes: object) -> SimConfig:
        return replace(self, **changes)

    @cached_property
    def adapter_size(self) -> int:
        return self.adapter_bytes or reference_adapter_bytes()

    @property
    def host_capacity(self) -> int:
        if self.host_cache_adapters is not None:
            return self.host_cache_adapters
        return max(1, int(self.host_ram_gb * GB // self.adapter_size))

    @property
    def copy_s(self) -> float:
        return self.adapter_size / (self.host_to_gpu_gb_s * GB)

    @property
    def per_sequence_tok_s(self) -> float:
        return self.tok_s_per_replica / self.max_running

    def to_dict(self) -> dict:
        data = asdict(self)
        data.update(adapter_size=self.adapter_size, host_capacity=self.host_capacity, copy_s=self.copy_s)
        return data
