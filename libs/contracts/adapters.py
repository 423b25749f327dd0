"""Adapters: lifecycle events from the registry and alias resolution (gateway -> registry)."""

from __future__ import annotations

import time
from enum import StrEnum

from pydantic import Field

from libs.contracts.base import AdapterRef, Message, new_id
from libs.contracts.tenants import TenantLimits


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


class ResolveRequest(Message):
    tenant: str
    alias: str
    # When set, the registry also authenticates the caller: the key must be a live key of `tenant`
    # (format `lpx_<tenant>_<key id>_<secret>`), else the reply is found=False, code "unauthorized".
    api_key: str | None = None


class ResolveReply(Message):
    found: bool
    adapter: AdapterRef | None = None
    error: str = ""
    # Machine-readable reason when found is False: not_found, not_active, unauthorized, bad_request,
    # unavailable. `version` is the resolved version number when found.
    code: str = ""
    version: int | None = None
    limits: TenantLimits | None = None  # the tenant's, when the request carried its key
