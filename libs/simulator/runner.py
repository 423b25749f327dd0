"""Run every selected policy on the same seeded traffic: steady state, then the cold-start storm."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from libs.routing import POLICY_NAMES
from libs.simulator.config import SimConfig
from libs.simulator.engine import Scenario, simulate
from libs.simulator.metrics import summarise
from libs.simulator.traffic import make_traffic

BASELINE_POLICY = "random"
OUR_POLICY = "bounded_load"
ProgressCallback = Callable[[str], None]


@dataclass
class Report:
    config: SimConfig
    policies: list[str]
    zipf_exponent: float
    steady: dict[str, dict] = field(default_factory=dict)
    cold_start: dict[str, dict] = field(default_factory=dict)
    cold_start_prewarmed: dict[str, dict] = field(default_factory=dict)
    # Steady state again with each replica pre-loading its ring share, then with a replica churning.
    placed: dict[str, dict] = field(default_factory=dict)
    placed_churn: dict[str, dict] = field(default_factory=dict)
    wall_s: float = 0.0

    def load_ratio(self, baseline: str = BASELINE_POLICY, policy: str = OUR_POLICY) -> float | None:
        """How many times fewer adapter loads per 1,000 requests `policy` makes than `baseline`."""
        if baseline not in self.steady or policy not in self.steady:
            return None
        ours = self.steady[policy]["loads_per_1000"]
        theirs = self.steady[baseline]["loads_per_1000"]
        return float("inf") if ours == 0 else theirs / ours

    def to_dict(self) -> dict:
        ratio = self.load_ratio()
        return {
            "config": self.config.to_dict(),
            "policies": self.policies,
            "zipf_exponent": self.zipf_exponent,
            "steady": self.steady,
            "cold_start": self.cold_start,
            "cold_start_prewarmed": self.cold_start_prewarmed,
            "placed": self.placed,
            "placed_churn": self.placed_churn,
            "loads_ratio_random_over_bounded_load": ratio,
            "wall_s": self.wall_s,
        }


def validate_policies(names: Sequence[str]) -> list[str]:
    unknown = [n for n in names if n not in POLICY_NAMES]
    if unknown:
        raise ValueError(f"unknown policies {', '.join(unknown)}; known: {', '.join(POLICY_NAMES)}")
    return list(dict.fromkeys(names))


def scenarios(config: SimConfig, storm: bool, placement: bool = True) -> list[Scenario]:
    chosen = [Scenario("steady", config.warmup_s, config.duration_s)]
    if placement:
        chosen.append(Scenario("placed", config.warmup_s, config.duration_s, placement=True))
        churn = config.churn_every_s
        chosen.append(Scenario("placed_churn", config.warmup_s, config.duration_s, placement=True, churn_every_s=churn))
    if storm:
        chosen.append(Scenario("cold_start", 0.0, config.storm_window_s))
        chosen.append(Scenario("cold_start_prewarmed", 0.0, config.storm_window_s, prewarm_top=config.prewarm_top))
    return chosen


def run_comparison(
    config: SimConfig,
    policies: Sequence[str] = POLICY_NAMES,
    storm: bool = True,
    progress: ProgressCallback | None = None,
    placement: bool = True,
) -> Report:
    started = time.perf_counter()
    names = validate_policies(policies)
    chosen = scenarios(config, storm, placement)
    horizon = max(s.warmup_s + s.window_s for s in chosen)
    traffic = make_traffic(config.adapters, config.top_k, config.top_share, config.requests_per_s, horizon, config.seed)
    report = Report(config=config, policies=names, zipf_exponent=traffic.zipf_exponent)
    for scenario in chosen:
        for name in names:
            summary = summarise(simulate(config, name, traffic, scenario))
            getattr(report, scenario.name)[name] = summary
            if progress:
                progress(f"{scenario.name}: {name}")
    report.wall_s = time.perf_counter() - started
    return report


def runs_in(policies: Sequence[str], storm: bool, placement: bool = True) -> int:
    """How many simulations `run_comparison` performs (for progress bars)."""
    return len(validate_policies(policies)) * (1 + (2 if storm else 0) + (2 if placement else 0))
