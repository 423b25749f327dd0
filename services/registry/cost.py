"""Estimated cost of a tenant's usage: (GPU $/h) / (output tok/s per GPU x 3600) per generated token.

The GPU price is configured (`LPX_REGISTRY_GPU_PRICE_PER_HOUR`) or the planner's default; the
throughput is measured (`LPX_REGISTRY_THROUGHPUT_REPORT`, the worker benchmark's mixed-adapter tok/s)
or the planner's assumption. Each figure says which it is. Only completion tokens are priced: the
measured throughput is output tokens per second with prefill included in the time, so prompt tokens
are already paid for in it.
"""

from __future__ import annotations

from dataclasses import dataclass

from libs.planner.inputs import PlanInputs, measured_tok_s_per_gpu
from services.registry.settings import RegistrySettings


@dataclass(frozen=True)
class CostBasis:
    gpu_price_per_hour: float
    gpu_price_source: str  # "configured" or "assumed (planner default)"
    tok_s_per_gpu: float
    tok_s_source: str  # "measured: <report>" or "assumed (planner default)" (+ why a report was not used)

    @property
    def usd_per_million_tokens(self) -> float:
        return self.gpu_price_per_hour / (self.tok_s_per_gpu * 3600) * 1e6

    def usd(self, completion_tokens: int) -> float:
        return completion_tokens / 1e6 * self.usd_per_million_tokens


def cost_basis(settings: RegistrySettings) -> CostBasis:
    planner = PlanInputs()
    if settings.gpu_price_per_hour is not None:
        price, price_source = settings.gpu_price_per_hour, "configured"
    else:
        price, price_source = planner.price_per_gpu_hour, "assumed (planner default)"
    tok_s, tok_s_source = planner.tok_s_per_gpu, "assumed (planner default)"
    if settings.throughput_report:
        try:
            tok_s = measured_tok_s_per_gpu(settings.throughput_report)
            tok_s_source = f"measured: {settings.throughput_report}"
        except ValueError as exc:
            tok_s_source = f"assumed (planner default; the throughput report was not usable: {exc})"
    return CostBasis(price, price_source, tok_s, tok_s_source)
