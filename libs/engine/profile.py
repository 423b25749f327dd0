"""An engine's measured cost model: decode step time against running sequences, and prefill rate.

Made by `benchmarks/calibrate_engine.py` on the real engine. Read by the simulated engine (so that a full
batch slows every sequence in it, as it does on a real one) and by the worker's latency guard (which
derives from it how many sequences keep per-token latency within a bound of the solo figure).
"""

from __future__ import annotations

import logging
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError, field_validator

log = logging.getLogger(__name__)

PROFILES_DIR = Path(__file__).with_name("profiles")


def default_profile_path(base_model: str, device: str = "cpu") -> Path:
    return PROFILES_DIR / f"{base_model}-{device}.json"


class EngineProfile(BaseModel):
    base_model: str
    device: str = "cpu"
    # running sequences -> seconds per decode step (each running sequence gets one token per step)
    decode_step_s: dict[int, float]
    prefill_tok_s: float = Field(gt=0)
    tokens: int = 0  # tokens decoded per request while calibrating
    adapters: int = 0  # distinct adapters in each calibration batch
    commit: str = "unknown"
    machine: str = ""
    created: str = ""

    @field_validator("decode_step_s")
    @classmethod
    def _usable(cls, steps: dict[int, float]) -> dict[int, float]:
        if not steps or 1 not in steps:
            raise ValueError("decode_step_s needs at least the solo figure (1 running sequence)")
        if any(size < 1 or step <= 0 for size, step in steps.items()):
            raise ValueError("decode_step_s: sizes >= 1 and step times > 0")
        return dict(sorted(steps.items()))

    @property
    def solo_step_s(self) -> float:
        return self.decode_step_s[1]

    def step_s(self, running: int) -> float:
        """Step time with `running` sequences: linear between measured sizes, and beyond the largest
        along the last measured segment's slope (a CPU step grows with the batch)."""
        running = max(1, running)
        sizes = list(self.decode_step_s)
        if running in self.decode_step_s:
            return self.decode_step_s[running]
        below = max((s for s in sizes if s < running), default=sizes[0])
        above = min((s for s in sizes if s > running), default=None)
        if above is None:
            if len(sizes) == 1:
                return self.decode_step_s[below]
            a, b = sizes[-2], sizes[-1]
            slope = (self.decode_step_s[b] - self.decode_step_s[a]) / (b - a)
            return self.decode_step_s[b] + max(0.0, slope) * (running - b)
        lo, hi = self.decode_step_s[below], self.decode_step_s[above]
        return lo + (hi - lo) * (running - below) / (above - below)

    def batch_within(self, bound: float, most: int) -> int:
        """The most running sequences (<= `most`) whose step time is within `bound` x the solo one;
        at least 1 (one sequence always runs, even when the bound cannot be met)."""
        limit = bound * self.solo_step_s * (1 + 1e-9)  # a step exactly at the bound is within it
        fits = [n for n in range(1, most + 1) if self.step_s(n) <= limit]
        return max(fits, default=1)


def load_profile(path: Path | None, base_model: str, device: str = "cpu") -> EngineProfile | None:
    """The profile at `path` (default: the shipped one for the base model), or None with one log line
    saying why: callers then keep their uncalibrated behaviour."""
    path = path or default_profile_path(base_model, device)
    try:
        return EngineProfile.model_validate_json(path.read_text())
    except FileNotFoundError:
        log.warning("no engine profile at %s (benchmarks/calibrate_engine.py makes one): uncalibrated", path)
    except (ValidationError, ValueError) as exc:
        reason = str(exc).splitlines()[0]
        log.warning("engine profile %s is malformed (%s): uncalibrated", path, reason)
    return None
