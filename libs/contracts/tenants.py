"""Tenants: their limits, the gateways' usage reports, tenant events and API-key authentication."""

from __future__ import annotations

import time
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from libs.contracts.base import Message, new_id

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
