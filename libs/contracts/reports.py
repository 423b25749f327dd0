"""The eval gate's report: what `EvaluationResult.report` holds, what the registry stores with the
version and what `lpx adapter report` renders. Every check the gate ran, each eval case's outcome,
timings, and the engine and library versions that produced them."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from libs.contracts.training import DatasetRef

CheckName = Literal["integrity", "structure", "load", "eval", "regression", "parity", "value"]
CHECK_ORDER: tuple[str, ...] = ("integrity", "structure", "load", "eval", "regression", "parity", "value")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CheckResult(_Model):
    name: CheckName
    status: Literal["passed", "failed", "skipped"]
    detail: str = ""
    seconds: float = 0.0


class CaseResult(_Model):
    id: str
    criterion: str
    passed: bool
    answer: str = ""  # the engine's greedy answer (truncated), empty for loglik cases
    expected: str | None = None
    score: float | None = None  # mean token log-likelihood for loglik cases
    threshold: float | None = None


class VersionScore(_Model):
    version: int
    digest: str
    passed: int
    total: int
    pass_rate: float
    mean_loglik: float | None = None  # over the loglik cases, if any
    cases: list[CaseResult] = Field(default_factory=list)


class ParityCase(_Model):
    prompt: str
    engine: str  # what the serving engine (vLLM) generated, greedy
    reference: str  # what transformers + peft generated, greedy
    agreement: float  # matching leading tokens / the longer output
    passed: bool


class Lift(_Model):
    """What the adapter adds over the base model alone on the same eval cases (the value check)."""

    pass_rate: float  # the adapter's pass rate minus the base model's
    loglik: float | None = None  # mean log-likelihood difference over the loglik cases, if any
    min_lift: float | None = None  # the pass-rate lift required to pass; None: reported only


class EvalReport(_Model):
    schema_version: Literal[1] = 1
    passed: bool
    reason: str
    tenant: str
    adapter: str
    version: int
    digest: str
    base_model: str
    dataset: DatasetRef | None = None
    threshold: float
    regression_margin: float
    checks: list[CheckResult] = Field(default_factory=list)
    candidate: VersionScore | None = None
    baseline: VersionScore | None = None  # the active version on the same cases (regression)
    parity: list[ParityCase] = Field(default_factory=list)
    base: VersionScore | None = None  # the base model alone on the same cases (value check)
    lift: Lift | None = None
    # The base model alone with the tenant's system prompt, when the tenant has one, and that lift.
    system_prompt: str | None = None
    base_prompted: VersionScore | None = None
    lift_prompted: Lift | None = None
    seconds: float = 0.0
    started_at: float = 0.0
    gate: dict[str, str | int | float] = Field(default_factory=dict)  # gate id, attempt, source event
    versions: dict[str, str] = Field(default_factory=dict)  # engine, libraries, device
