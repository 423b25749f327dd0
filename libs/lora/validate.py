"""Structural validation of a LoRA adapter against the base model it is meant for.

The registry runs this at push and the eval gate re-runs it as defence in depth: a rank, shape,
target or dtype mismatch must never reach a worker, and a NaN/Inf weight must never be served.
Each failure raises `AdapterInvalid` with a machine-readable `code` and a message a human can act on.

Nothing here unpickles or imports a framework: tensor headers come from `libs.lora.format`, and the
NaN/Inf scan reads the raw safetensors bytes through a numpy memory map (IEEE floats are non-finite
exactly when all exponent bits are set, which works for bf16 too, where numpy has no dtype).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from libs.lora.format import WEIGHTS_FILE, AdapterFiles
from libs.models.catalog import BaseModelSpec

# safetensors dtype tag -> canonical name (the names policies and version rows use).
SAFETENSORS_DTYPES: dict[str, str] = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3",
    "F8_E5M2": "float8_e5m2",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
}

# For each float dtype: (item width in bytes, the exponent mask of its bit pattern).
_EXPONENT_MASKS: dict[str, tuple[int, int]] = {
    "F64": (8, 0x7FF0_0000_0000_0000),
    "F32": (4, 0x7F80_0000),
    "F16": (2, 0x7C00),
    "BF16": (2, 0x7F80),
}

DEFAULT_ALLOWED_DTYPES = ("float32", "float16", "bfloat16")

# PEFT features vLLM's multi-LoRA kernels cannot apply: refusing them beats serving a different model.
_UNSUPPORTED_FLAGS = ("use_dora", "use_rslora", "use_qalora")


class AdapterInvalid(ValueError):
    """The adapter cannot be served on this base under this policy; `code` says which rule failed."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Policy:
    """What a pool accepts. The default pool takes rank <= 16 (the brief's registry policy)."""

    max_rank: int = 16
    allowed_dtypes: tuple[str, ...] = DEFAULT_ALLOWED_DTYPES


def canonical_dtype(tag: str) -> str:
    return SAFETENSORS_DTYPES.get(tag, tag.lower())


def validate_adapter(
    files: AdapterFiles, spec: BaseModelSpec, policy: Policy = Policy(), check_values: bool = True
) -> None:
    """Every structural rule, cheapest first; raises AdapterInvalid on the first failure."""
    check_config(files.config)
    check_rank(files, policy.max_rank)
    check_targets(files, spec)
    check_dtype(files, policy.allowed_dtypes)
    check_shapes(files, spec)
    if check_values:
        check_finite(files.directory / WEIGHTS_FILE)


def check_config(config: dict) -> None:
    peft_type = str(config.get("peft_type", "LORA")).upper()
    if peft_type != "LORA":
        raise AdapterInvalid("not_lora", f"peft_type is {peft_type!r}; only LORA adapters can be served")
    rank = config.get("r")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank <= 0:
        raise AdapterInvalid("bad_config", f"adapter_config.json: 'r' must be a positive integer, got {rank!r}")
    alpha = config.get("lora_alpha", rank)
    if not isinstance(alpha, int | float) or isinstance(alpha, bool) or alpha <= 0:
        raise AdapterInvalid(
            "bad_config", f"adapter_config.json: 'lora_alpha' must be a positive number, got {alpha!r}"
        )
    for flag in _UNSUPPORTED_FLAGS:
        if config.get(flag):
            raise AdapterInvalid(
                "unsupported_feature", f"adapter_config.json sets {flag}; the serving engine applies plain LoRA only"
            )
    if config.get("rank_pattern") or config.get("alpha_pattern"):
        raise AdapterInvalid("unsupported_feature", "per-module ranks (rank_pattern/alpha_pattern) are not supported")
    if config.get("modules_to_save"):
        raise AdapterInvalid("unsupported_feature", "modules_to_save (fully fine-tuned modules) are not supported")
    if config.get("bias", "none") != "none":
        raise AdapterInvalid("unsupported_feature", f"bias={config.get('bias')!r} is not supported; use bias='none'")


def check_rank(files: AdapterFiles, max_rank: int) -> None:
    if files.rank > max_rank:
        raise AdapterInvalid(
            "rank_too_high",
            f"rank {files.rank} exceeds this pool's limit of max_rank={max_rank} "
            f"(retrain at rank <= {max_rank} or push to a pool that allows it)",
        )


def check_targets(files: AdapterFiles, spec: BaseModelSpec) -> None:
    declared = files.config.get("target_modules")
    if not isinstance(declared, list) or not declared or not all(isinstance(t, str) for t in declared):
        raise AdapterInvalid(
            "bad_targets", f"target_modules must be an explicit list of module names, got {declared!r}"
        )
    supported = spec.module_shapes()
    unknown = sorted(set(declared) - set(supported))
    if unknown:
        raise AdapterInvalid(
            "unsupported_target",
            f"target modules {', '.join(unknown)} are not supported by base "
            f"{spec.name} (supported: {', '.join(supported)})",
        )
    stray = sorted({t.module for t in files.tensors.values()} - set(declared))
    if stray:
        raise AdapterInvalid(
            "unsupported_target", f"weights hold tensors for {', '.join(stray)}, which target_modules does not declare"
        )


def check_dtype(files: AdapterFiles, allowed: Iterable[str]) -> None:
    allowed = tuple(allowed)
    found = sorted(canonical_dtype(d) for d in files.dtypes)
    if not found:
        raise AdapterInvalid("empty_adapter", "the weights file holds no LoRA tensors")
    refused = [d for d in found if d not in allowed]
    if refused:
        raise AdapterInvalid(
            "dtype_not_allowed", f"tensor dtype {', '.join(refused)} is not allowed (allowed: {', '.join(allowed)})"
        )
    if len(found) > 1:
        raise AdapterInvalid("mixed_dtypes", f"tensors mix dtypes {', '.join(found)}; one adapter has one dtype")


def check_shapes(files: AdapterFiles, spec: BaseModelSpec) -> None:
    """A is (r x in) and B is (out x r) for the base's module shapes, in existing layers, in pairs."""
    shapes, rank = spec.module_shapes(), files.rank
    pairs: dict[tuple[int, str], set[str]] = {}
    for key, tensor in files.tensors.items():
        if tensor.layer >= spec.num_layers:
            raise AdapterInvalid(
                "shape_mismatch",
                f"{key}: layer {tensor.layer} does not exist in {spec.name} ({spec.num_layers} layers)",
            )
        shape = shapes[tensor.module]
        expected = (rank, shape.in_features) if tensor.kind == "A" else (shape.out_features, rank)
        if tensor.shape != expected:
            raise AdapterInvalid(
                "shape_mismatch",
                f"{key}: shape {list(tensor.shape)} does not match "
                f"{list(expected)} expected for {tensor.module} of {spec.name} "
                f"at rank {rank}",
            )
        pairs.setdefault((tensor.layer, tensor.module), set()).add(tensor.kind)
    for (layer, module), kinds in sorted(pairs.items()):
        if kinds != {"A", "B"}:
            raise AdapterInvalid("shape_mismatch", f"layer {layer} {module}: lora_A and lora_B must come in pairs")


def check_finite(weights: Path) -> None:
    """Refuse NaN or Inf anywhere in the float tensors (streamed through a memory map)."""
    for name, tag, data in _iter_tensor_bytes(weights):
        if tag in _EXPONENT_MASKS and _has_non_finite(data, tag):
            raise AdapterInvalid("non_finite", f"tensor {name} contains NaN or Inf values")


def _has_non_finite(data, tag: str) -> bool:
    import numpy as np

    width, mask = _EXPONENT_MASKS[tag]
    words = data.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[width])
    mask_value = np.array(mask, dtype=words.dtype)
    return bool(np.any((words & mask_value) == mask_value))


def _iter_tensor_bytes(weights: Path) -> Iterator[tuple[str, str, object]]:
    """(name, dtype tag, uint8 view of its bytes) for every tensor of a safetensors file."""
    import numpy as np

    with open(weights, "rb") as handle:
        (header_len,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(header_len))
    body = np.memmap(weights, dtype=np.uint8, mode="r", offset=8 + header_len)
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        yield name, entry["dtype"], body[begin:end]
