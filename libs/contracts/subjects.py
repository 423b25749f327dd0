"""Subject, stream and bucket names. Nothing else in the code base spells a subject.

Inference subjects are keyed by pool, worker and adapter so that each worker consumes an affinitized
slice of one work-queue stream (a JetStream work queue rejects overlapping consumer filters, so every
worker filters on its own `lpx.infer.<pool>.<worker>.>` prefix).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

PREFIX = "lpx"

# --- inference ---------------------------------------------------------------------------------
INFER_STREAM = "LPX_INFER"
INFER_ALL = f"{PREFIX}.infer.>"

# Async submission (callers -> gateway) and results kept for a while (gateway -> callers). A tenant
# publishes on its own `lpx.submit.<tenant>` (the broker lets its credential publish nowhere else) and
# reads its answers under `lpx.results.t.<tenant>.>` / `lpx.tokens.t.<tenant>.>`.
SUBMIT_STREAM = "LPX_SUBMIT"
SUBMIT_ALL = f"{PREFIX}.submit.>"
RESULTS_STREAM = "LPX_RESULTS"
RESULTS_ALL = f"{PREFIX}.results.>"
# Token deltas are ephemeral (core NATS, not stored): a stream consumer that misses them still
# gets the final result from the results stream.
TOKENS_ALL = f"{PREFIX}.tokens.>"

# --- registry ----------------------------------------------------------------------------------
EVENTS_STREAM = "LPX_EVENTS"
EVENTS_ALL = f"{PREFIX}.events.>"
ADAPTER_EVENTS = f"{PREFIX}.events.adapter.>"
# A tenant's limits changed or one of its keys was revoked: every gateway drops what it cached.
TENANT_EVENTS = f"{PREFIX}.events.tenant.>"
EVALUATED = f"{PREFIX}.events.eval.evaluated"
RESOLVE = f"{PREFIX}.registry.resolve"  # request/reply, not stored
AUTH = f"{PREFIX}.registry.auth"  # request/reply: TenantAuthRequest -> TenantAuthReply
EVAL_CONTEXT = f"{PREFIX}.registry.eval_context"  # request/reply: EvalContextRequest -> EvalContextReply

# --- eval gate ---------------------------------------------------------------------------------
# The gate's record of finished evaluations (source event id -> the EvaluationResult it published),
# so a redelivered event is answered with the same verdict instead of being evaluated again.
EVAL_LEDGER_BUCKET = "lpx_eval_ledger"

# --- training ----------------------------------------------------------------------------------
TRAIN_STREAM = "LPX_TRAIN"
TRAIN_JOBS = f"{PREFIX}.train.jobs"
# Progress of each job (step, loss, done), kept a day so a CLI that attaches late sees where it is.
TRAIN_PROGRESS_STREAM = "LPX_TRAIN_PROGRESS"
TRAIN_PROGRESS_ALL = f"{PREFIX}.train.progress.>"
# The trainer's record of finished jobs (job id -> final TrainProgress): a redelivered job is not retrained.
TRAIN_LEDGER_BUCKET = "lpx_train_ledger"

# --- dead letters ------------------------------------------------------------------------------
DLQ_STREAM = "LPX_DLQ"
DLQ_ALL = f"{PREFIX}.dlq.>"

# --- key-value buckets -------------------------------------------------------------------------
HEARTBEAT_BUCKET = "lpx_workers"
# Each gateway's recent demand per pool (an AdapterDemand under key <pool>.<gateway>): what the workers
# pre-load, each its share of the ring, most requested first.
ADAPTER_DEMAND_BUCKET = "lpx_adapter_demand"
# Every active adapter version (an AdapterRef under its digest), written by the registry: the workers place
# their ring share of it before anyone asks for it (demand counts only know what was requested already).
ACTIVE_ADAPTERS_BUCKET = "lpx_active_adapters"

_TOKEN_OK = re.compile(r"[A-Za-z0-9_-]+")


def token(value: str) -> str:
    """One subject token from an id. Ids are validated upstream; this refuses anything that would
    change the subject's shape (dots, wildcards, whitespace) instead of silently rewriting it."""
    if not _TOKEN_OK.fullmatch(value):
        raise ValueError(f"{value!r} is not a valid subject token (letters, digits, '_' and '-' only)")
    return value


def infer(pool: str, worker: str, adapter: str) -> str:
    """Work for `adapter` routed to `worker` of `pool`. Use adapter 'base' for base-model requests."""
    return f"{PREFIX}.infer.{token(pool)}.{token(worker)}.{token(adapter)}"


def infer_worker_filter(pool: str, worker: str) -> str:
    return f"{PREFIX}.infer.{token(pool)}.{token(worker)}.>"


def worker_durable(pool: str, worker: str) -> str:
    """The durable consumer through which a worker takes the work routed to it."""
    return f"w-{token(pool)}-{token(worker)}"


def pool_durable(pool: str) -> str:
    """The durable consumer the workers of a pool share (hand-offs, re-routes with nobody live)."""
    return f"pool-{token(pool)}"


# Work any worker of a pool may take (one durable consumer shared by the pool, so each message goes
# to exactly one of them): hand-offs from a draining worker, re-routes of a dead worker's backlog.
# Worker ids may not start with '_', so this never overlaps a worker's own filter.
ANY_WORKER = "_any"


def infer_any(pool: str, adapter: str) -> str:
    return f"{PREFIX}.infer.{token(pool)}.{ANY_WORKER}.{token(adapter)}"


def infer_any_filter(pool: str) -> str:
    return f"{PREFIX}.infer.{token(pool)}.{ANY_WORKER}.>"


# Each worker's in-flight count on every change (core NATS, not stored): see WorkerLoad.
WORKER_LOAD_ALL = f"{PREFIX}.load.>"


def worker_load(pool: str, worker: str) -> str:
    return f"{PREFIX}.load.{token(pool)}.{token(worker)}"


def pool_load_filter(pool: str) -> str:
    """Every worker's WorkerLoad in one pool (the workers' own load bound listens to it)."""
    return f"{PREFIX}.load.{token(pool)}.*"


# Each gateway's admissions per tenant, a few times a second (core NATS, not stored): see LimitReport.
GATEWAY_LIMITS_ALL = f"{PREFIX}.limits.>"


def gateway_limits(gateway: str) -> str:
    return f"{PREFIX}.limits.{token(gateway)}"


def demand_key(pool: str, gateway: str) -> str:
    return f"{token(pool)}.{token(gateway)}"


def submit(tenant: str) -> str:
    """Where `tenant` submits async work (a tenant credential may publish here and nowhere else)."""
    return f"{PREFIX}.submit.{token(tenant)}"


def submitter_of(subject: str) -> str | None:
    """The tenant a submission subject names, or None for a subject of another shape."""
    parts = subject.split(".")
    if len(parts) != 3 or parts[:2] != [PREFIX, "submit"] or not _TOKEN_OK.fullmatch(parts[2]):
        return None
    return parts[2]


def tenant_results(tenant: str, request_id: str) -> str:
    """A submission's checked result, readable by its tenant only (stored in the RESULTS stream)."""
    return f"{PREFIX}.results.t.{token(tenant)}.{token(request_id)}"


def tenant_results_filter(tenant: str) -> str:
    return f"{PREFIX}.results.t.{token(tenant)}.>"


def tenant_tokens(tenant: str, request_id: str) -> str:
    return f"{PREFIX}.tokens.t.{token(tenant)}.{token(request_id)}"


def tenant_tokens_filter(tenant: str) -> str:
    return f"{PREFIX}.tokens.t.{token(tenant)}.>"


def tenant_inbox_prefix(tenant: str) -> str:
    """The reply-inbox prefix of a tenant's connection (JetStream publish acks, direct gets): its
    credential may subscribe under this prefix only, never to other clients' inboxes."""
    return f"_INBOX.lpx-t.{token(tenant)}"


def direct_get_last(stream: str, subject: str) -> str:
    """JetStream's direct-get API subject for the last message on `subject` (streams with
    allow_direct): permissions can scope it to a subject prefix, unlike STREAM.MSG.GET."""
    return f"$JS.API.DIRECT.GET.{stream}.{subject}"


def results(request_id: str) -> str:
    return f"{PREFIX}.results.{token(request_id)}"


def tokens(request_id: str) -> str:
    return f"{PREFIX}.tokens.{token(request_id)}"


# Worker -> the one gateway that asked (InferenceRequest.reply_to): a gateway subscribes to its own
# prefix only, so N gateways do not each receive every result and token of the fleet. Still under
# `lpx.results.>`: stored in the RESULTS stream like every result.
def results_to(gateway: str, request_id: str) -> str:
    return f"{PREFIX}.results.gw.{token(gateway)}.{token(request_id)}"


def results_to_filter(gateway: str) -> str:
    return f"{PREFIX}.results.gw.{token(gateway)}.>"


def tokens_to(gateway: str, request_id: str) -> str:
    return f"{PREFIX}.tokens.gw.{token(gateway)}.{token(request_id)}"


def tokens_to_filter(gateway: str) -> str:
    return f"{PREFIX}.tokens.gw.{token(gateway)}.>"


# One worker's token deltas of one engine step for one gateway (TokenBatch). Six tokens where a request's
# own subject has five, so it can never be mistaken for a request id (ids hold no '.'); under the
# gateway's `tokens_to_filter`, so no permission changes.
TOKEN_BATCH_MARK = "steps"


def token_batch_to(gateway: str, worker: str) -> str:
    return f"{PREFIX}.tokens.gw.{token(gateway)}.{TOKEN_BATCH_MARK}.{token(worker)}"


def is_token_batch(subject: str) -> bool:
    parts = subject.split(".")
    return len(parts) == 6 and parts[4] == TOKEN_BATCH_MARK


def result_subject(request_id: str, reply_to: str | None) -> str:
    """Where the result of an inference request goes: its gateway's prefix, or the shared one."""
    return results_to(reply_to, request_id) if reply_to else results(request_id)


def result_lookup(request_id: str, reply_to: str | None) -> str:
    """The subject filter under which a stored result of `request_id` is looked up (last message):
    whichever gateway it was for. A request id is unique, and a submission re-dispatched by another
    gateway after its first gateway died keeps its id: the answer the first one got is the answer."""
    return f"{PREFIX}.results.gw.*.{token(request_id)}" if reply_to else results(request_id)


def token_subject(request_id: str, reply_to: str | None) -> str:
    return tokens_to(reply_to, request_id) if reply_to else tokens(request_id)


def adapter_event(kind: str) -> str:
    return f"{PREFIX}.events.adapter.{token(kind)}"


def tenant_event(kind: str) -> str:
    return f"{PREFIX}.events.tenant.{token(kind)}"


def train_progress(job_id: str) -> str:
    return f"{PREFIX}.train.progress.{token(job_id)}"


def dead_letter(service: str) -> str:
    return f"{PREFIX}.dlq.{token(service)}"


@dataclass(frozen=True)
class StreamSpec:
    """A JetStream stream the platform needs; `lpx stack up` and every service ensure these exist."""

    name: str
    subjects: tuple[str, ...]
    retention: str = "limits"  # "limits" | "workqueue" | "interest"
    max_age_s: float = 0  # 0 = keep forever
    duplicate_window_s: float = 120  # Nats-Msg-Id de-duplication window
    description: str = ""
    extra: dict = field(default_factory=dict, compare=False)
    allow_direct: bool = False  # direct gets (a tenant reads its stored results through them)


STREAMS: tuple[StreamSpec, ...] = (
    StreamSpec(INFER_STREAM, (INFER_ALL,), retention="workqueue", description="routed inference work"),
    StreamSpec(SUBMIT_STREAM, (SUBMIT_ALL,), retention="workqueue", description="async submissions"),
    StreamSpec(
        RESULTS_STREAM, (RESULTS_ALL,), max_age_s=24 * 3600, description="final results, kept 24h", allow_direct=True
    ),
    StreamSpec(EVENTS_STREAM, (EVENTS_ALL,), max_age_s=7 * 24 * 3600, description="lifecycle events"),
    StreamSpec(TRAIN_STREAM, (TRAIN_JOBS,), retention="workqueue", description="training jobs"),
    StreamSpec(TRAIN_PROGRESS_STREAM, (TRAIN_PROGRESS_ALL,), max_age_s=24 * 3600, description="training progress"),
    StreamSpec(DLQ_STREAM, (DLQ_ALL,), max_age_s=14 * 24 * 3600, description="dead letters with reasons"),
)


def _matches(pattern: str, subject: str) -> bool:
    want, got = pattern.split("."), subject.split(".")
    for i, token_ in enumerate(want):
        if token_ == ">":
            return len(got) > i
        if i >= len(got) or (token_ != "*" and token_ != got[i]):
            return False
    return len(got) == len(want)


def stream_of(subject: str) -> str:
    """The stream that stores `subject` (for publishers that must wait for the stream's ack)."""
    for spec in STREAMS:
        if any(_matches(pattern, subject) for pattern in spec.subjects):
            return spec.name
    raise ValueError(f"no stream stores {subject!r}")
