"""Tiny synthetic PEFT adapters for a tiny base spec: the validation rules tested in milliseconds."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from libs.models.catalog import BaseModelSpec

TINY = BaseModelSpec(
    name="tiny",
    architecture="LlamaForCausalLM",
    num_layers=2,
    hidden_size=8,
    intermediate_size=16,
    num_attention_heads=2,
    num_key_value_heads=1,
    vocab_size=32,
)


def tensors_for(spec: BaseModelSpec, rank: int, modules: list[str], dtype=np.float32) -> dict[str, np.ndarray]:
    shapes = spec.module_shapes()
    out = {}
    for layer in range(spec.num_layers):
        for module in modules:
            block = "self_attn" if module in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            key = f"base_model.model.model.layers.{layer}.{block}.{module}"
            shape = shapes[module]
            out[f"{key}.lora_A.weight"] = np.full((rank, shape.in_features), 0.01, dtype=dtype)
            out[f"{key}.lora_B.weight"] = np.full((shape.out_features, rank), 0.02, dtype=dtype)
    return out


def write_adapter(
    directory: Path, *, rank: int = 4, modules=("q_proj", "v_proj"), tensors=None, **config_changes
) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    config = {
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": 2 * rank,
        "target_modules": list(modules),
        "bias": "none",
        "base_model_name_or_path": "tiny",
        "rank_pattern": {},
        "alpha_pattern": {},
        "use_dora": False,
        "modules_to_save": None,
    }
    config.update(config_changes)
    (directory / "adapter_config.json").write_text(json.dumps(config))
    if tensors is None:
        tensors = tensors_for(TINY, rank, list(modules))
    save_file(tensors, str(directory / "adapter_model.safetensors"))
    return directory


def write_torch_adapter(directory: Path, tensors: dict, rank: int = 4, modules=("q_proj", "v_proj")) -> Path:
    """For dtypes numpy cannot hold (bfloat16)."""
    from safetensors.torch import save_file as save_torch

    write_adapter(directory, rank=rank, modules=modules)
    save_torch(tensors, str(directory / "adapter_model.safetensors"))
    return directory
