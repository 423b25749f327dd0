"""LoRA adapter math and format helpers shared by the registry, workers and planner."""

from libs.lora.sizing import (
    DTYPE_BYTES,
    LoraSize,
    ModuleLoraSize,
    base_model_params,
    dtype_bytes,
    lora_params_per_layer,
    lora_size,
    resolve_targets,
)

__all__ = [
    "DTYPE_BYTES",
    "LoraSize",
    "ModuleLoraSize",
    "base_model_params",
    "dtype_bytes",
    "lora_params_per_layer",
    "lora_size",
    "resolve_targets",
]
