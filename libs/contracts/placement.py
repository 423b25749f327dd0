"""Placement contracts: what the gateways tell the workers about demand, so that each worker keeps its
share of the ring (`libs.routing`) on local disk before requests need it."""

from __future__ import annotations

import time

from pydantic import Field

from libs.contracts.base import AdapterRef, Message

__all__ = ["AdapterDemand", "DemandEntry", "MAX_DEMAND_ENTRIES"]

# One gateway's demand for one pool is one KV value (at most 1 MiB): its most requested adapters only.
MAX_DEMAND_ENTRIES = 2000


class DemandEntry(Message):
    ref: AdapterRef
    requests: float = Field(ge=0)  # requests seen, decayed by the gateway's half-life


class AdapterDemand(Message):
    """One gateway's recent demand in one pool, most requested first, under key `<pool>.<gateway>` of
    `subjects.ADAPTER_DEMAND_BUCKET`. Workers add up every gateway's value for their pool."""

    pool: str
    gateway_id: str
    adapters: list[DemandEntry] = Field(default_factory=list, max_length=MAX_DEMAND_ENTRIES)
    half_life_s: float = Field(gt=0)
    ts: float = Field(default_factory=time.time)
