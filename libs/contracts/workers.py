"""Workers: their heartbeats and load reports (what the gateways route by) and commands to a pool."""

from __future__ import annotations

import time

from pydantic import ConfigDict, Field

from libs.contracts.base import Message
from libs.contracts.inference import AdapterTier


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
    # Placement (services/worker/placement.py): adapters the ring gives it (with demand), those on its disk,
    # those still to fetch.
    placement_owned: int = 0
    placement_resident: int = 0
    placement_backlog: int = 0
    # The pool's load bound (services/worker/load_bound.py): messages passed on to another worker since start.
    bound_passed_on: int = 0
    # ... and pool messages it kept over the bound after they came back MAX_RETURNS times (no worker had room).
    bound_kept_over: int = 0


class WorkerLoad(Message):
    """A worker's in-flight count, published (core NATS) whenever it changes: the gateways' bounded-load
    routing sees the pool's real load within milliseconds instead of one heartbeat interval."""

    worker_id: str
    pool: str
    in_flight: int
    ts: float = Field(default_factory=time.time)
