"""LoRA size math from tensor shapes.

A LoRA on a linear layer W (out x in) adds A (r x in) and B (out x r): r x (in + out) parameters per
targeted module per layer. Nothing here is a typed-in constant except the width of each dtype.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from libs.models.catalog import ALL_MODULES, ATTENTION_MODULES, MLP_MODULES, BaseModelSpec, ModuleShape

DTYPE_BYTES: dict[str, int] = {
    "float32": 4,
    "fp32": 4,
    "bfloat16": 2,
    "bf16": 2,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "float8": 1,
    "fp8": 1,
}

TARGET_ALIASES: dict[str, tuple[str, ...]] = {
    "all": ALL_MODULES,
    "attention": ATTENTION_MODULES,
    "attn": ATTENTION_MODULES,
    "mlp": MLP_MODULES,
}


def dtype_bytes(dtype: str) -> int:
    key = dtype.lower().removeprefix("torch.")
    try:
        return DTYPE_BYTES[key]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(sorted(DTYPE_BYTES))}") from None


def resolve_targets(targets: str | Iterable[str]) -> tuple[str, ...]:
    """Module names from a comma-separated string or an iterable; 'all', 'attention', 'mlp' expand.

    Short names without the '_proj' suffix (q, k, v, o, gate, up, down) are accepted too. The result keeps
    the catalog's module order and has no duplicates.
    """
    names = targets.split(",") if isinstance(targets, str) else list(targets)
    chosen: set[str] = set()
    for raw in names:
        name = raw.strip().lower()
        if not name:
            continue
        if name in TARGET_ALIASES:
            chosen.update(TARGET_ALIASES[name])
            continue
        module = name if name.endswith("_proj") else f"{name}_proj"
        if module not in ALL_MODULES:
            raise ValueError(f"unknown target module {raw!r}; known: {', '.join(ALL_MODULES)} or all/attention/mlp")
        chosen.add(module)
    if not chosen:
        raise ValueError("at least one target module is required")
    return tuple(m for m in ALL_MODULES if m in chosen)


def lora_params_per_layer(shape: ModuleShape, rank: int) -> int:
    """A is r x in, B is out x r."""
    return rank * (shape.in_features + shape.out_features)


@dataclass(frozen=True)
class ModuleLoraSize:
    module: str
    in_features: int
    out_features: int
    params_per_layer: int


@dataclass(frozen=True)
class LoraSize:
    base: str
    rank: int
    targets: tuple[str, ...]
    dtype: str
    num_layers: int
    modules: tuple[ModuleLoraSize, ...]

    @property
    def params_per_layer(self) -> int:
        return sum(m.params_per_layer for m in self.modules)

    @property
    def params(self) -> int:
        return self.params_per_layer * self.num_layers

    @property
    def bytes_per_param(self) -> int:
        return dtype_bytes(self.dtype)

    @property
    def bytes(self) -> int:
        return self.params * self.bytes_per_param

    def to_dict(self) -> dict:
        return {
            "base": self.base,
            "rank": self.rank,
            "targets": list(self.targets),
            "dtype": self.dtype,
            "num_layers": self.num_layers,
            "modules": [m.__dict__ for m in self.modules],
            "params_per_layer": self.params_per_layer,
            "params": self.params,
            "bytes": self.bytes,
        }


def lora_size(
    spec: BaseModelSpec, rank: int, targets: str | Iterable[str] = ALL_MODULES, dtype: str | None = None
) -> LoraSize:
    """Parameters and bytes of one adapter of `rank` on `targets` of `spec` (dtype defaults to the base's)."""
    if rank < 1:
        raise ValueError("rank must be >= 1")
    modules = resolve_targets(targets)
    shapes = spec.module_shapes()
    per_module = tuple(
        ModuleLoraSize(m, shapes[m].in_features, shapes[m].out_features, lora_params_per_layer(shapes[m], rank))
        for m in modules
    )
    chosen_dtype = dtype or spec.dtype
    dtype_bytes(chosen_dtype)  # fail early on an unknown dtype
    return LoraSize(spec.name, rank, modules, chosen_dtype, spec.num_layers, per_module)


def base_model_params(spec: BaseModelSpec, tied_embeddings: bool = False) -> int:
    """Weights of the base model from its shapes: projections, norms, embeddings (and an untied LM head)."""
    projections = sum(s.in_features * s.out_features for s in spec.module_shapes().values())
    norms = 2 * spec.hidden_size  # input and post-attention RMSNorm weights per layer
    per_layer = projections + norms
    embeddings = spec.vocab_size * spec.hidden_size
    lm_head = 0 if tied_embeddings else embeddings
    final_norm = spec.hidden_size
    return spec.num_layers * per_layer + embeddings + lm_head + final_norm
