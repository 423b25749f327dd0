"""`lpx migrate plan`'s estimate comes from the base's shapes, per retrainable adapter."""

from __future__ import annotations

import pytest

from libs.cli import train_cmds
from libs.planner import training


def test_estimate_scales_with_adapters_steps_and_size():
    plan = {"items": [{"dataset": "d"}, {"dataset": "d"}, {"dataset": None}]}
    small, _ = train_cmds._estimate(plan, {"params": 100e6}, steps=30)
    per_job_s = (
        6 * 100e6 * 30 * 4 * train_cmds.TOKENS_PER_EXAMPLE / (training.GPU_PEAK_FLOPS * training.GPU_UTILISATION)
        + training.JOB_OVERHEAD_S
    )
    assert small == pytest.approx(2 * per_job_s / 3600)  # the adapter without a dataset is not counted
    big, cost = train_cmds._estimate(plan, {"params": 8e9}, steps=300)
    assert big > small and cost == pytest.approx(big * train_cmds.PRICE_PER_GPU_HOUR)
