"""Planner inputs. Defaults are the reference deployment of BRIEF.md section 2."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from libs.lora.sizing import resolve_targets
from libs.models.catalog import CATALOG, LLAMA_31_8B, BaseModelSpec
from libs.planner.training import GPU_PEAK_FLOPS, GPU_UTILISATION, JOB_OVERHEAD_S
from libs.tier_costs import HOST_TO_GPU_GB_S, NVME_GB_S, OBJECT_STORE_FETCH_S_MAX, OBJECT_STORE_FETCH_S_MIN

HOURS_PER_YEAR = 365 * 24
MONTHS_PER_YEAR = 12
# `tie_word_embeddings` of the presets' config.json files (catalog.py does not carry the flag yet).
_PRESET_TIED_EMBEDDINGS = {"smollm2-135m": True, "llama-3.1-8b": False}


@dataclass(frozen=True)
class PlanInputs:
    base: str = LLAMA_31_8B.name  # a catalog preset name or a path to a Hugging Face config.json
    rank: int = 16
    targets: str = "all"
    dtype: str | None = None  # None: the base model's dtype
    adapters: int = 2000
    # Traffic skew: the `top_k` most popular adapters carry `top_share` of requests (Zipf).
    top_k: int = 100
    top_share: float = 0.80
    requests_per_s: float = 500.0
    output_tokens: int = 300
    tok_s_per_gpu: float = 5000.0  # at SLO, LoRA overhead included
    # Headroom: run GPUs at most this busy, so bursts, spills and load stalls do not break the SLO.
    target_utilization: float = 0.75
    price_per_gpu_hour: float = 2.50
    hot_adapters_per_gpu: int = 100
    gpu_memory_gb: float = 80.0  # H100 SXM
    host_to_gpu_gb_s: float = HOST_TO_GPU_GB_S  # PCIe Gen5, effective
    object_store_fetch_s_min: float = OBJECT_STORE_FETCH_S_MIN
    object_store_fetch_s_max: float = OBJECT_STORE_FETCH_S_MAX
    nvme_gb_s: float = NVME_GB_S  # local NVMe read, PCIe Gen4 x4
    host_ram_gb: float = 256.0  # host RAM per worker set aside for the adapter cache
    nvme_gb: float = 3840.0  # local NVMe per worker for the adapter disk tier
    tied_embeddings: bool | None = None  # None: untied unless the config says tie_word_embeddings
    # Base-model upgrade: retrain every adapter. Two estimates side by side: an assumed GPU-hours per
    # adapter, and the FLOPs model (6 x base params x tokens trained per adapter, at a utilisation).
    assumed_gpu_hours_per_adapter: float = 0.5
    dataset_tokens: int = 2_000_000  # tokens trained per adapter, epochs included
    training_utilization: float = GPU_UTILISATION
    gpu_peak_flops: float = GPU_PEAK_FLOPS
    job_overhead_s: float = JOB_OVERHEAD_S
    training_gpus: int = 8  # GPUs retraining at once: sets how long both base pools run side by side
    # Where tok_s_per_gpu comes from: "assumed" (an input) or "measured: <benchmark file>".
    throughput_source: str = "assumed"
    # Variants the planner answers alongside the main plan.
    variant_large_rank: int = 64
    variant_many_adapters: int = 20_000
    variant_small_rank: int = 8
    variant_small_targets: str = "attention"

    def __post_init__(self) -> None:
        positive = {
            "rank": self.rank,
            "adapters": self.adapters,
            "top_k": self.top_k,
            "requests_per_s": self.requests_per_s,
            "output_tokens": self.output_tokens,
            "tok_s_per_gpu": self.tok_s_per_gpu,
            "hot_adapters_per_gpu": self.hot_adapters_per_gpu,
            "gpu_memory_gb": self.gpu_memory_gb,
            "host_to_gpu_gb_s": self.host_to_gpu_gb_s,
            "nvme_gb_s": self.nvme_gb_s,
            "host_ram_gb": self.host_ram_gb,
            "dataset_tokens": self.dataset_tokens,
            "gpu_peak_flops": self.gpu_peak_flops,
            "training_gpus": self.training_gpus,
        }
        bad = [name for name, value in positive.items() if value <= 0]
        if bad:
            raise ValueError(f"must be > 0: {', '.join(bad)}")
        if not 0 < self.target_utilization <= 1:
            raise ValueError("target_utilization must be in (0, 1]")
        if not 0 < self.training_utilization <= 1:
            raise ValueError("training_utilization must be in (0, 1]")
        if self.assumed_gpu_hours_per_adapter < 0 or self.job_overhead_s < 0:
            raise ValueError("assumed_gpu_hours_per_adapter and job_overhead_s must be >= 0")
        if self.object_store_fetch_s_min > self.object_store_fetch_s_max:
            raise ValueError("object_store_fetch_s_min must be <= object_store_fetch_s_max")
        resolve_targets(self.targets)

    def with_changes(self, **changes: object) -> PlanInputs:
        return replace(self, **changes)

    @property
    def hours_per_month(self) -> float:
        return HOURS_PER_YEAR / MONTHS_PER_YEAR


def load_base(base: str) -> tuple[BaseModelSpec, bool]:
    """Resolve a preset name, a config.json path or a model directory holding one; also report whether
    the embeddings are tied (the LM head then adds no weights)."""
    if base in CATALOG:
        spec = CATALOG[base]
        tied = spec.extra.get("tie_word_embeddings", _PRESET_TIED_EMBEDDINGS.get(spec.name, False))
        return spec, bool(tied)
    path = Path(base)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ValueError(f"{base!r} is neither a known base model ({', '.join(sorted(CATALOG))}) nor a config.json")
    config = json.loads(path.read_text())
    return BaseModelSpec.from_hf_config(config, name=path.parent.name or path.stem), bool(
        config.get("tie_word_embeddings", False)
    )


def measured_tok_s_per_gpu(path: Path) -> float:
    """Output tok/s of one worker with adapters mixed in the batch, from `make bench`'s worker.json
    (throughput.mixed_adapters.tok_per_s): the measured replacement of the assumed tok_s_per_gpu."""
    try:
        report = json.loads(Path(path).read_text())
        value = float(report["throughput"]["mixed_adapters"]["tok_per_s"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(
            f"{path}: not a worker benchmark report with throughput.mixed_adapters.tok_per_s "
            f"({type(exc).__name__}: {exc})"
        ) from exc
    if value <= 0:
        raise ValueError(f"{path}: measured throughput must be > 0, got {value}")
    return value
