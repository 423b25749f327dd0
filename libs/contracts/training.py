"""Training and evaluation: datasets, train jobs and their progress, the eval gate's context and verdicts."""

from __future__ import annotations

import time
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from libs.contracts.base import DIGEST_PATTERN, ID_PATTERN, AdapterRef, Message, new_id


class DatasetRef(BaseModel):
    """A stored dataset (content-addressed JSONL, see libs.datasets)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    digest: str = Field(pattern=DIGEST_PATTERN)
    object_key: str
    train_examples: int = 0
    eval_cases: int = 0


class EvaluationResult(Message):
    event_id: str = Field(default_factory=new_id)
    digest: str = Field(pattern=DIGEST_PATTERN)
    passed: bool
    reason: str = ""
    report: dict = Field(default_factory=dict)
    # Which version was evaluated (echo of the "registered" event). Without them the verdict applies
    # to every version with this digest that awaits evaluation.
    tenant: str | None = None
    adapter: str | None = None
    version: int | None = None


class EvalContextRequest(Message):
    """Eval gate -> registry (`subjects.EVAL_CONTEXT`, request/reply): what the gate needs to evaluate
    one version. With `claim`, a pending version moves to `evaluating` (announced by an event)."""

    tenant: str
    adapter: str
    version: int
    claim: bool = False


class EvalContextReply(Message):
    found: bool
    code: str = ""  # when not found: not_found, bad_request, unavailable
    error: str = ""
    status: str | None = None  # the version's lifecycle status (after a claim)
    ref: AdapterRef | None = None
    base_spec: dict | None = None  # the BaseModelSpec fields of the version's base model
    dataset: DatasetRef | None = None  # where the eval cases are (None: the tenant has none)
    threshold: float | None = None  # the tenant's pass-rate threshold (None: the gate's default)
    # The version the adapter's aliases serve now, the regression baseline (None: first version).
    active_version: int | None = None
    active_ref: AdapterRef | None = None
    # Its stored eval report: the baseline when it is on another base (a migration), where this
    # gate's engine cannot load it.
    active_report: dict | None = None
    # The tenant's value check: the minimum lift (None: the gate's setting) and the system prompt the
    # base model is also scored with (None: without one only).
    min_lift: float | None = None
    system_prompt: str | None = None


class TrainJob(Message):
    """Train one LoRA adapter from a stored dataset (`subjects.TRAIN_JOBS`, a JetStream work queue;
    Nats-Msg-Id = job_id). The trained adapter is pushed to the registry as a new version of
    `tenant/adapter` and goes through the eval gate like any other."""

    job_id: str = Field(default_factory=new_id, pattern=ID_PATTERN)
    tenant: str
    adapter: str
    dataset: DatasetRef
    base_model: str
    # The recipe (the pool policy's rank, alpha and targets; empty targets: the trainer's default).
    rank: int = Field(16, ge=1)
    alpha: int = Field(32, ge=1)
    target_modules: list[str] = Field(default_factory=list)
    steps: int = Field(30, ge=1, le=100_000)
    batch_size: int = Field(4, ge=1, le=1024)
    learning_rate: float = Field(2e-3, gt=0)
    seed: int = 0
    # Set when the job is part of a base-model migration (the registry links the new version to it).
    migration_id: str | None = None
    migration_item: int | None = None
    requested_by: str = "lpx"


class TrainStage(StrEnum):
    STARTED = "started"
    TRAINING = "training"
    PUSHED = "pushed"
    FAILED = "failed"


class TrainProgress(Message):
    """Progress of one job on `subjects.train_progress(job_id)` (stored a day in TRAIN_PROGRESS_STREAM)."""

    job_id: str
    tenant: str
    adapter: str
    stage: TrainStage
    step: int = 0
    total_steps: int = 0
    loss: float | None = None
    done: bool = False  # the last message of the job (pushed or failed)
    error: str | None = None
    version: int | None = None  # the registry version number of the pushed adapter
    digest: str | None = None
    trainer_id: str = ""
    ts: float = Field(default_factory=time.time)
