"""Worker settings (env prefix LPX_WORKER_)."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from libs.paths import lpx_home, models_dir
from libs.settings import ServiceSettings


def _default_worker_id() -> str:
    host = "".join(c if c.isalnum() or c == "-" else "-" for c in socket.gethostname())[:40]
    return f"{host}-{os.getpid()}"


class WorkerSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="LPX_WORKER_", extra="ignore")

    worker_id: str = Field(default_factory=_default_worker_id, description="unique in the pool; not starting with _")
    pool: str = Field("smollm2-135m-r16", description="pool name: base model + max rank")
    base_model: str = "smollm2-135m"
    model_path: Path | None = Field(None, description="base checkpoint dir; default $LPX_HOME/models/<base_model>")
    device: str = "auto"
    # The engine: vLLM. "sim" is the simulated engine for fleet load tests only (no model loaded;
    # answers name the applied adapter), with its rates below.
    engine: Literal["vllm", "sim"] = "vllm"
    sim_prefill_tok_s: float = Field(4000.0, gt=0)
    sim_decode_tok_s: float = Field(50.0, gt=0, description="per sequence")
    # A measured engine profile for the simulated engine to follow (step time against batch size,
    # prefill rate) instead of the two rates above: libs/engine/profiles/<base>-cpu.json for the demo model.
    sim_profile: Path | None = None
    # Engine tiers (vLLM): adapters batched at once, and adapters kept in host RAM.
    max_loras: int = 4
    max_cpu_loras: int = 16
    max_lora_rank: int = 16
    max_num_seqs: int = 32
    max_model_len: int = 2048
    cpu_kvcache_gib: int = 1
    # Requests generated concurrently (what the worker pulls from JetStream at most).
    capacity: int = 16
    # Streamed tokens as one message per engine step per gateway (TokenBatch) instead of one per token of
    # each request. Off only while gateways older than TokenBatch still run (they read per-token subjects:
    # upgrade gateways before workers).
    token_batches: bool = True
    # How requests reach the engine. "engine" (default): at once, vLLM's scheduler queues them for its
    # max_loras slots, and a guard holds newcomers of other adapters once an adapter request has waited
    # `max_adapter_wait_s` for a slot (no starvation). "grouped": held in the worker and handed over
    # grouped by adapter (fewer slot swaps, more waiting). "fifo": at once, unguarded.
    admission: Literal["engine", "grouped", "fifo"] = "engine"
    # The starvation bound: how long an adapter request may wait for a slot (in the engine, or in the worker
    # under "grouped") before newcomers of other adapters are held back. 10 s: under a 3x-max_loras mix on
    # 2 CPU cores vLLM's own queueing reaches 3-4 s, and a tighter bound held requests that were not
    # starving (0.88x vllm serve's throughput at 2 s in benchmarks/bench_vs_vllm.py).
    max_adapter_wait_s: float = Field(10.0, gt=0)
    # Fair batch share (services/worker/batch_share.py): a tenant below its share of `capacity` starts at
    # once, and while one has work the batch drains to the size whose decode step is within
    # `latency_bound` x the solo step, as the engine profile measured it (`latency_profile`; default: the
    # shipped profile of the base model; none or a bad one: no drain, shares only). The worker then pulls
    # up to `max_num_seqs` requests (a calm tenant's request must not wait in JetStream behind the flood).
    latency_guard: bool = True
    latency_bound: float = Field(1.5, gt=1.0)
    # How long a tenant keeps the batch drained after its last request here ended: a calm tenant's next
    # request must not find the batch refilled by a flood in the gap between two of its requests.
    latency_linger_s: float = Field(3.0, ge=0)
    latency_profile: Path | None = None
    # Local disk tier: content-addressed by digest, LRU bounded in bytes.
    disk_cache_dir: Path | None = None
    disk_cache_bytes: int = 2 * 1024**3
    # Placement (services/worker/placement.py): keep this worker's share of the ring on disk before requests
    # need it. Re-planned every interval (a membership change is adopted once seen on two plans in a row),
    # fetched at most `placement_fetch_per_s`, within `placement_disk_share` of the disk tier; the
    # `placement_host_ram_top` most requested also into the engine's host-RAM cache. The staleness must be
    # the gateways' (LPX_GATEWAY_HEARTBEAT_STALENESS_S): both sides must see the same ring.
    placement: bool = True
    placement_interval_s: float = Field(10.0, gt=0)
    placement_fetch_per_s: float = Field(10.0, gt=0)
    placement_disk_share: float = Field(0.8, gt=0, le=1)
    placement_host_ram_top: int = Field(4, ge=0)
    # Also place the active versions nobody requested yet (the registry's active set), after the requested.
    placement_active_set: bool = True
    placement_staleness_s: float = Field(10.0, gt=0)
    # How many of an adapter's ring positions keep it on disk: 1, its owner alone; 2 (the default), also the
    # next worker on its ring, where the bound sends its requests while the owner is full, so a spilled
    # request loads from disk, not from the object store. Each position costs one more copy on disk.
    placement_positions: int = Field(2, ge=1)
    # The pool's load bound, checked again here (services/worker/load_bound.py): a message taken from this
    # worker's own subject while its load is over ceil(c * (m + 1) / n) goes to the pool's shared subject,
    # and the shared subject is pulled only within the bound. `balance_factor` must be the gateways'
    # (LPX_GATEWAY_BALANCE_FACTOR). Off: the gateways' bound alone (a few percent over it with several).
    load_bound: bool = True
    balance_factor: float = Field(1.25, gt=1.0)
    heartbeat_interval_s: float = 2.0
    heartbeat_ttl_s: float = 10.0
    ack_wait_s: float = 30.0
    drain_timeout_s: float = 120.0

    @field_validator("worker_id")
    @classmethod
    def _worker_id_is_a_subject_token(cls, value: str) -> str:
        from libs.contracts import subjects

        subjects.token(value)
        if value.startswith("_"):
            raise ValueError("worker ids may not start with '_' (reserved for pool-wide subjects)")
        return value

    def resolved_model_path(self) -> Path:
        return self.model_path or models_dir() / self.base_model

    def resolved_disk_cache_dir(self) -> Path:
        return self.disk_cache_dir or lpx_home() / "adapter-cache" / self.worker_id
