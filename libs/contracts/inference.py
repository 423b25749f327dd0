"""Inference: routed work (gateway -> worker), its streamed tokens and its result, and the tenant's
async submission that becomes one."""

from __future__ import annotations

import time
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from libs.contracts.base import ID_PATTERN, AdapterRef, Message

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


# A NATS header (not a body field: workers of the previous release forbid unknown fields, and ignore
# headers) a gateway sets on the first dispatch of a request id it minted itself for an HTTP request.
# Nothing can have answered that id yet, so on the message's first delivery, soon after it was sent, a
# worker may skip its duplicate lookup (one JetStream round trip per request, before the engine). Copies
# (load-bound pass-on, drain hand-off) and re-routes carry another Nats-Msg-Id than
# `first_dispatch_id`, so the worker does not take them for fresh.
FRESH_REQUEST_HEADER = "Lpx-Fresh-Request"


def first_dispatch_id(request_id: str, gateway_id: str | None) -> str:
    """Nats-Msg-Id of a request's first dispatch by `gateway_id`: that gateway's retries are stored once,
    while another gateway dispatching the same id (a submission redelivered after its first gateway
    died) is not taken for a duplicate and dropped by JetStream (its answer would never come)."""
    return f"{request_id}@{gateway_id}" if gateway_id else request_id


class TokenDelta(Message):
    request_id: str
    index: int
    text: str
    logprobs: list[TokenLogprob] | None = None  # the delta's tokens, when the request asked for logprobs


class TokenBatch(Message):
    """The token deltas one worker produced in one engine step for one gateway's requests, sent as one
    message on `subjects.token_batch_to(gateway, worker)` instead of one message per request and token:
    the broker and the gateway handle a message per step, not per token. Deltas of one request keep
    their order (one worker, one connection, one subject)."""

    worker_id: str
    deltas: list[TokenDelta]


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
    load_left_at: float | None = None  # the worker's load report leaving it out (just before result_sent_at)


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
