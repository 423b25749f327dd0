"""Typed messages. Every message carries `schema_version`; a consumer refuses versions it does not
know (the message goes to the dead-letter subject with the reason) instead of guessing.

Adapter identity is the content digest (sha256 of the version's files). Names and aliases never
appear where a cache key or an applied-adapter check is needed.
"""

from __future__ import annotations

import time
import uuid
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "SCHEMA_VERSION",
    "Message",
    "AdapterRef",
    "SamplingParams",
    "StructuredOutput",
    "MAX_LOGPROBS",
    "TopLogprob",
    "TokenLogprob",
    "ChatMessage",
    "InferenceRequest",
    "TokenDelta",
    "Timings",
    "ErrorInfo",
    "InferenceResult",
    "AdapterTier",
    "WorkerHeartbeat",
    "WorkerLoad",
    "AdapterEventKind",
    "AdapterEvent",
    "EvaluationResult",
    "DatasetRef",
    "EvalContextRequest",
    "EvalContextReply",
    "ResolveRequest",
    "ResolveReply",
    "TenantLimits",
    "TenantEvent",
    "TenantEventKind",
    "MAX_LIMIT_RPS",
    "MAX_LIMIT_TPM",
    "MAX_LIMIT_CONCURRENCY",
    "MAX_FAIR_WEIGHT",
    "TenantUsageDelta",
    "LimitReport",
    "TrainJob",
    "TrainProgress",
    "TrainStage",
    "DeadLetter",
    "PrewarmCommand",
    "SubmitRequest",
    "TenantAuthRequest",
    "TenantAuthReply",
    "new_id",
]

SCHEMA_VERSION = 1
DIGEST_PATTERN = r"^[0-9a-f]{64}$"
ID_PATTERN = r"^[A-Za-z0-9_-]{1,128}$"


def new_id() -> str:
    return uuid.uuid4().hex


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = SCHEMA_VERSION


class AdapterRef(BaseModel):
    """What a worker needs to fetch, verify and apply one immutable adapter version."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    digest: str = Field(pattern=DIGEST_PATTERN)
    object_key: str
    base_model: str
    rank: int = Field(gt=0)
    size_bytes: int = Field(ge=0, default=0)


MAX_LOGPROBS = 20  # vLLM's default max_logprobs; OpenAI's chat top_logprobs goes to 20 too


class StructuredOutput(BaseModel):
    """Constrained decoding (vLLM's structured outputs): JSON of any shape, or JSON valid against a schema."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["json_object", "json_schema"]
    json_schema: dict | None = Field(None, description="the JSON Schema, for kind json_schema")

    @model_validator(mode="after")
    def _schema_is_valid(self) -> StructuredOutput:
        if self.kind == "json_object":
            if self.json_schema is not None:
                raise ValueError("json_object takes no schema")
            return self
        if self.json_schema is None:
            raise ValueError("json_schema needs a schema")
        check_json_schema(self.json_schema)
        return self


def check_json_schema(schema: dict) -> None:
    """ValueError naming what is wrong when `schema` is not a valid JSON Schema (draft 2020-12)."""
    from jsonschema import Draft202012Validator, SchemaError

    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.path) or "the schema's top level"
        raise ValueError(f"not a valid JSON Schema at {where}: {exc.message}") from None


class SamplingParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    max_tokens: int = Field(default=128, ge=1, le=8192)
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    stop: list[str] = Field(default_factory=list, max_length=8)
    seed: int | None = None
    # Log-probabilities of the generated tokens, each with this many alternatives (vLLM's `logprobs`:
    # the sampled token first, then the most likely ones); None: none are computed.
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    structured: StructuredOutput | None = None


class TopLogprob(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    token: str
    logprob: float


class TokenLogprob(BaseModel):
    """One generated token: its text, log-probability and the engine's alternatives in its order."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    token: str
    logprob: float
    top: list[TopLogprob] = Field(default_factory=list)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    role: Literal["system", "user", "assistant"]
    content: str


class InferenceRequest(Message):
    """Routed work: gateway -> worker on `subjects.infer(pool, worker, adapter)`."""

    request_id: str = Field(pattern=ID_PATTERN)
    tenant_id: str
    base_model: str
    adapter: AdapterRef | None = None  # None means the caller asked for the base model itself
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    stream: bool = False
    deadline: float | None = None  # unix seconds; past it the worker answers with a deadline error
    submitted_at: float = Field(default_factory=time.time)
    # The gateway waiting for the answer (a subject token): results and tokens go to its own subjects
    # (subjects.results_to / tokens_to). None: the shared subjects (subjects.results / tokens).
    reply_to: str | None = Field(None, pattern=r"^[A-Za-z0-9_-]+$", max_length=64)


class TokenDelta(Message):
    request_id: str
    index: int
    text: str
    logprobs: list[TokenLogprob] | None = None  # the delta's tokens, when the request asked for logprobs


class Timings(BaseModel):
    """Where a request's time went on the worker: durations, and the stage timeline as unix seconds
    (the gateway lines these up with its own stamps; stages across hosts carry their clock skew)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    queue_s: float = 0.0
    adapter_load_s: float = 0.0
    admission_wait_s: float = 0.0  # waiting for an adapter slot (adapter-aware admission)
    ttft_s: float = 0.0
    total_s: float = 0.0
    fetched_at: float | None = None  # the worker took the message from JetStream
    engine_added_at: float | None = None  # handed to the engine (adapter usable, slot admitted)
    first_token_at: float | None = None
    last_token_at: float | None = None
    result_sent_at: float | None = None  # the result was about to be published


class ErrorInfo(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    code: str  # machine-readable: adapter_unavailable, digest_mismatch, deadline, bad_request, ...
    message: str


class AdapterTier(StrEnum):
    """Where an adapter was found when a request needed it (hot to cold)."""

    GPU = "gpu"  # already in an engine slot
    CPU = "cpu"  # in the engine's host-RAM LoRA cache
    DISK = "disk"  # in the worker's local content-addressed disk cache
    OBJECT_STORE = "object_store"  # fetched from S3
    NONE = "none"  # base-model request


class InferenceResult(Message):
    request_id: str
    worker_id: str
    ok: bool
    text: str = ""
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    adapter_digest_applied: str | None = None
    adapter_tier: AdapterTier = AdapterTier.NONE
    logprobs: list[TokenLogprob] | None = None  # every generated token, when the request asked for them
    timings: Timings = Field(default_factory=Timings)
    error: ErrorInfo | None = None
    # Who asked and for what (copied from the request by the worker): usage metering counts from these.
    tenant: str | None = None
    adapter_digest: str | None = None  # requested; None: the base model
    base_model: str | None = None


class WorkerHeartbeat(Message):
    # A state report, not a command: fields a newer worker adds are ignored by older readers (gateways,
    # lpx), so workers can be upgraded before or after them. schema_version still guards a real change.
    model_config = ConfigDict(extra="ignore", frozen=True)

    worker_id: str
    pool: str
    base_model: str
    max_rank: int
    capacity: int
    in_flight: int
    queued: int = 0  # routed to this worker, not yet taken (its consumers' pending messages)
    instance: str = ""  # one per worker process: tells a restart of this worker from another with its id
    # tier -> digests, most recently used first. The disk tier's list is bounded (a disk can hold
    # thousands; a beat is one KV value, at most 1 MiB): `adapter_counts` has every tier's full count.
    adapters: dict[AdapterTier, list[str]] = Field(default_factory=dict)
    adapter_counts: dict[AdapterTier, int] = Field(default_factory=dict)  # empty: a worker from before; len(list)
    ts: float = Field(default_factory=time.time)
    # For `lpx top` and `lpx adapter where` (0 / empty: a worker from before these fields).
    max_loras: int = 0  # engine adapter slots: the most adapters in the GPU tier at once
    max_cpu_loras: int = 0  # adapters the engine keeps in host RAM (the CPU tier)
    generated_tokens: int = 0  # completion tokens since this instance started (tok/s: delta between beats)
    # The batch share (0: none): sequences running, and the batch tenants over their share may fill now
    # (`capacity`, or the drained size derived from the engine profile while a tenant below its share has work).
    batch_running: int = 0
    batch_limit: int = 0
    tier_hits: dict[AdapterTier, int] = Field(default_factory=dict)  # requests per tier their adapter was found at
    # The worker's hottest adapters now -> requests for each since the worker started (rates: delta between beats).
    adapter_requests: dict[str, int] = Field(default_factory=dict)
    # Resident digest -> unix time it entered its current tier (as seen by this worker's beats: +/- one interval).
    adapter_since: dict[str, float] = Field(default_factory=dict)


class WorkerLoad(Message):
    """A worker's in-flight count, published (core NATS) whenever it changes: the gateways' bounded-load
    routing sees the pool's real load within milliseconds instead of one heartbeat interval."""

    worker_id: str
    pool: str
    in_flight: int
    ts: float = Field(default_factory=time.time)


class AdapterEventKind(StrEnum):
    REGISTERED = "registered"
    EVALUATING = "evaluating"
    ACTIVATED = "activated"
    REJECTED = "rejected"
    RETIRED = "retired"
    ALIAS_MOVED = "alias_moved"
    EVAL_REQUESTED = "eval_requested"  # someone asked the gate to (re-)evaluate this version


class AdapterEvent(Message):
    event_id: str = Field(default_factory=new_id)
    kind: AdapterEventKind
    tenant: str
    adapter: str
    digest: str | None = None
    alias: str | None = None
    base_model: str | None = None
    detail: str = ""
    ts: float = Field(default_factory=time.time)
    # The version this event is about: its number and what a consumer (the eval gate, a worker's
    # cache) needs to fetch and verify it. None on events not about one version.
    version: int | None = None
    ref: AdapterRef | None = None


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


class DatasetRef(BaseModel):
    """A stored dataset (content-addressed JSONL, see libs.datasets)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    digest: str = Field(pattern=DIGEST_PATTERN)
    object_key: str
    train_examples: int = 0
    eval_cases: int = 0


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


class ResolveRequest(Message):
    tenant: str
    alias: str
    # When set, the registry also authenticates the caller: the key must be a live key of `tenant`
    # (format `lpx_<tenant>_<key id>_<secret>`), else the reply is found=False, code "unauthorized".
    api_key: str | None = None


# Upper bounds of a tenant limit: beyond them a value is a typo, not a plan (the same bounds in the
# registry's API and in these messages).
MAX_LIMIT_RPS = 100_000.0
MAX_LIMIT_TPM = 1_000_000_000
MAX_LIMIT_CONCURRENCY = 100_000
MAX_FAIR_WEIGHT = 1_000.0


class TenantLimits(BaseModel):
    """A tenant's limits at the gateway; None = the pool default (the gateway's settings)."""

    model_config = ConfigDict(extra="forbid")
    rps: float | None = Field(None, gt=0, le=MAX_LIMIT_RPS, description="requests per second")
    tpm: int | None = Field(None, gt=0, le=MAX_LIMIT_TPM, description="prompt + completion tokens per minute")
    concurrency: int | None = Field(None, gt=0, le=MAX_LIMIT_CONCURRENCY, description="requests in flight")
    weight: float | None = Field(
        None, gt=0, le=MAX_FAIR_WEIGHT, description="share of a full pool relative to other tenants (default 1)"
    )


class TenantUsageDelta(BaseModel):
    """What one gateway admitted for one tenant since its last report."""

    model_config = ConfigDict(extra="forbid")
    requests: int = Field(0, ge=0)
    tokens: int = 0  # estimates charged at admission, then corrections (negative) when answers come
    in_flight: int = Field(0, ge=0)  # the gateway's requests of this tenant in flight now (absolute)


class LimitReport(Message):
    """`subjects.gateway_limits(gateway)`, core NATS, several times a second: one gateway's admissions per
    tenant, so that every replica counts the others' against the tenants' limits."""

    gateway_id: str
    tenants: dict[str, TenantUsageDelta] = Field(default_factory=dict)
    ts: float = Field(default_factory=time.time)


class TenantEventKind(StrEnum):
    LIMITS_CHANGED = "limits_changed"
    KEY_REVOKED = "key_revoked"


class TenantEvent(Message):
    """`subjects.tenant_event(kind)`: published by the registry (outbox) when something every gateway
    caches about a tenant changed."""

    event_id: str = Field(default_factory=new_id)
    kind: TenantEventKind
    tenant: str
    key_id: str | None = None
    limits: TenantLimits | None = None
    ts: float = Field(default_factory=time.time)


class ResolveReply(Message):
    found: bool
    adapter: AdapterRef | None = None
    error: str = ""
    # Machine-readable reason when found is False: not_found, not_active, unauthorized, bad_request,
    # unavailable. `version` is the resolved version number when found.
    code: str = ""
    version: int | None = None
    limits: TenantLimits | None = None  # the tenant's, when the request carried its key


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


class DeadLetter(Message):
    """A message a service could not process, kept with the reason (nothing is dropped silently)."""

    service: str
    original_subject: str
    reason: str
    payload: str  # original bytes, decoded as UTF-8 with replacement (the first 64 KiB characters)
    payload_bytes: int = 0  # size of the original payload
    truncated: bool = False  # the payload kept here is the start of a longer one
    headers: dict[str, str] = Field(default_factory=dict)
    ts: float = Field(default_factory=time.time)


class PrewarmCommand(Message):
    """Load these adapters (hottest first) into a pool's workers before traffic needs them."""

    pool: str
    adapters: list[AdapterRef] = Field(default_factory=list)
    top_n: int | None = None  # None: the worker's own setting


class SubmitRequest(Message):
    """Async submission: a tenant -> gateway on `subjects.submit(tenant)` (JetStream, Nats-Msg-Id =
    `<tenant>-<request_id>`; the broker lets a tenant's credential publish on its own subject only).

    The final InferenceResult lands on `subjects.tenant_results(tenant, request_id)` in the RESULTS
    stream; with `stream`, TokenDeltas are relayed on `subjects.tenant_tokens(tenant, request_id)` (core
    NATS, ephemeral). Only that tenant's credential can read either.
    Resubmitting the same request_id never generates twice. Ids are at most 100 characters (the
    gateway derives its internal work id from it)."""

    # Required on the wire: the result is published under it, so one the caller does not know is lost.
    request_id: str = Field(pattern=r"^[A-Za-z0-9_-]{1,100}$")
    api_key: str
    model: str  # an adapter alias of the caller's tenant, or a base model name
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    stream: bool = False
    timeout_s: float | None = Field(default=None, gt=0, le=24 * 3600)  # None: the gateway's default
    submitted_at: float = Field(default_factory=time.time)
    # batch (default): fills the capacity interactive traffic leaves; interactive: admitted like an HTTP call.
    tier: Literal["batch", "interactive"] = "batch"


class TenantAuthRequest(Message):
    """Authenticate a tenant API key without resolving an alias (`subjects.AUTH`, request/reply)."""

    api_key: str


class TenantAuthReply(Message):
    ok: bool
    tenant: str | None = None
    code: str = ""  # when not ok: unauthorized, bad_request, unavailable
    error: str = ""
    # The tenant's aliases that resolve to an active version now (for /v1/models).
    aliases: list[str] = Field(default_factory=list)
    limits: TenantLimits | None = None
