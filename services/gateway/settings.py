"""Gateway settings (env prefix LPX_GATEWAY_)."""

from __future__ import annotations

import os
import socket
import uuid
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from libs.contracts import MAX_LIMIT_CONCURRENCY, MAX_LIMIT_RPS, MAX_LIMIT_TPM, TenantLimits
from libs.routing import DEFAULT_BALANCE_FACTOR, DEFAULT_HOT_THRESHOLD, DEFAULT_MAX_SPREAD
from libs.settings import ServiceSettings


def _default_gateway_id() -> str:
    host = "".join(c if c.isalnum() or c == "-" else "-" for c in socket.gethostname())[:40]
    return f"{host[:30]}-{os.getpid()}-{uuid.uuid4().hex[:6]}"  # unique even for two gateways in one process


class GatewaySettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="LPX_GATEWAY_", extra="ignore")

    # Unique per replica: workers send this gateway's results and tokens to its own subjects.
    gateway_id: str = Field(default_factory=_default_gateway_id, max_length=64)
    # Bounded-load routing by the pool's load (workers' heartbeats + this replica's requests since) or
    # by this replica's own in-flight counts only (one gateway, or for comparison).
    load_signal: Literal["fleet", "local"] = "fleet"
    # loraplex's bounded-load adapter affinity; the others are baselines for benchmarks.
    routing_policy: Literal["bounded_load", "random", "least_loaded", "consistent_hash"] = "bounded_load"

    host: str = "0.0.0.0"
    port: int = 8000
    # Deadline of a request when the caller gives none (HTTP and async submissions), and the most
    # a submission may ask for.
    request_timeout_s: float = Field(120.0, gt=0)
    # Alias resolution / key authentication cache: positive entries are fresh for `resolve_ttl_s`
    # and kept as a stale fallback while the registry is unavailable; refusals for `negative_ttl_s`.
    resolve_ttl_s: float = Field(30.0, ge=0)
    # A positive answer served once older than this is asked again in the background (hot keys never
    # wait on the registry at their TTL); at or above resolve_ttl_s it never is.
    resolve_refresh_after_s: float = Field(20.0, ge=0)
    # An answer used within this long is refreshed ahead of its TTL even while no request comes, so a
    # tenant back after a pause does not wait on the registry (0: only answers hit when due are). It was
    # off for a while: one CI run with it on saw the registry refused one reply (a NATS Publish Violation).
    # The registry now sends no reply the server would refuse (services/registry/deadlines.py).
    resolve_keep_warm_s: float = Field(300.0, ge=0)
    negative_ttl_s: float = Field(2.0, ge=0)
    resolve_timeout_s: float = Field(2.0, gt=0)
    cache_max_entries: int = 100_000
    # Prompts longer than this (characters, summed over messages) are refused with 400.
    max_prompt_chars: int = 32_000
    # A request body larger than this is refused with 413 before it is read (its Content-Length).
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024, le=1024**3)
    # A worker is dead when its heartbeat key is gone or older than this; the view polls this often.
    heartbeat_staleness_s: float = Field(10.0, gt=0)
    pool_poll_s: float = Field(0.5, gt=0)
    # Routing (libs.routing.BoundedLoadRouter).
    balance_factor: float = DEFAULT_BALANCE_FACTOR
    hot_threshold: int = DEFAULT_HOT_THRESHOLD
    max_spread: int = DEFAULT_MAX_SPREAD
    # Async submission: a durable consumer shared by every gateway replica. (How long results stay is
    # the RESULTS stream's max_age, declared with the other streams in libs/contracts/subjects.py.)
    submit_durable: str = "gateway-submit"
    submit_concurrency: int = 256
    # While the broker is unreachable (restart, leader election) a request's publish is retried with
    # the same Nats-Msg-Id for this long (never past its deadline), then answered 503.
    publish_retry_s: float = Field(30.0, ge=0)
    # A worker that drained cleanly handed its backlog to the pool: re-route what is left after this.
    drain_grace_s: float = Field(30.0, ge=0)
    # Pool defaults of the per-tenant limits (a tenant's own limits, `lpx tenant limits`, win); unset:
    # no limit. Counted across the gateway replicas (services/gateway/limit_sync.py).
    default_rps: float | None = Field(None, gt=0, le=MAX_LIMIT_RPS)
    default_tpm: int | None = Field(None, gt=0, le=MAX_LIMIT_TPM)
    default_concurrency: int | None = Field(None, gt=0, le=MAX_LIMIT_CONCURRENCY)
    # How often a replica tells the others what it admitted per tenant (0: count alone, per replica).
    limit_sync_s: float = Field(0.1, ge=0, le=10)
    # Placement: how often this gateway tells the workers what each pool's adapters are asked for (0: never),
    # and how fast old requests stop counting (services/gateway/demand.py).
    demand_publish_s: float = Field(10.0, ge=0)
    demand_half_life_s: float = Field(1800.0, gt=0)
    # Async submissions over their tenant's limit wait here (not refused) until the limit allows them;
    # once this many of one tenant wait at this gateway, the next is refused with a rate_limited result.
    submit_tenant_queue: int = Field(64, ge=1, le=10_000)
    # An interactive request the pool cannot finish before its deadline (from the queue ahead of it and
    # the measured time per request, services/gateway/overload.py) gets 503 + Retry-After at once
    # instead of 504 after the whole deadline; margin < 1 refuses earlier, > 1 later.
    early_refusal: bool = True
    overload_margin: float = Field(1.0, gt=0, le=10)
    # Once a pool's load reaches fair_headroom x its capacity, requests wait at the gateway per tenant and
    # go on by fair share, interactive before batch (services/gateway/fairness.py); false: FIFO.
    fair_queuing: bool = True
    fair_headroom: float = Field(1.25, ge=1, le=10)
    # Share of a pool's capacity batch work (async submissions) leaves free for interactive requests:
    # batch fills the rest and never queues on the workers (0: batch may fill all of it).
    batch_reserve: float = Field(0.125, ge=0, lt=1)
    # Base models served (model names accepted as "the base model itself"); pools' heartbeats add theirs.
    base_models: list[str] = Field(default_factory=lambda: ["smollm2-135m"])

    @field_validator("gateway_id")
    @classmethod
    def _gateway_id_is_a_subject_token(cls, value: str) -> str:
        from libs.contracts import subjects

        return subjects.token(value)

    def default_limits(self) -> TenantLimits:
        return TenantLimits(rps=self.default_rps, tpm=self.default_tpm, concurrency=self.default_concurrency)
