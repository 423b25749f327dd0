"""The training cost model shared by `lpx plan` (the base-upgrade budget) and `lpx migrate plan`.

Training one LoRA adapter costs about 6 x params x tokens FLOPs (forward and backward through the
base model for every trained token), run at a fraction of the GPU's peak (model FLOPs utilisation),
plus a fixed overhead per job (load the base, save and push the adapter). Estimates: every caller
prints the assumptions next to the figure.
"""

from __future__ import annotations

GPU_PEAK_FLOPS = 989e12  # H100 SXM dense BF16
GPU_UTILISATION = 0.35  # model FLOPs utilisation of a small LoRA job
JOB_OVERHEAD_S = 60.0  # load the base, save and push, per adapter


def training_flops(params: int, tokens: int) -> float:
    return 6.0 * params * tokens


def training_gpu_hours(
    params: int,
    tokens: int,
    *,
    peak_flops: float = GPU_PEAK_FLOPS,
    utilisation: float = GPU_UTILISATION,
    overhead_s: float = JOB_OVERHEAD_S,
) -> float:
    """GPU-hours to train one adapter on `tokens` tokens (epochs included) of a `params` base."""
    return (training_flops(params, tokens) / (peak_flops * utilisation) + overhead_s) / 3600
