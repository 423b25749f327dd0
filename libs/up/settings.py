"""`LPX_UP_*`: how `lpx up` lays the platform out on this machine."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class UpSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LPX_UP_", extra="ignore")

    # 0: a free port, chosen on the first `lpx up` and kept (the URLs printed stay valid).
    gateway_port: int = Field(0, ge=0, le=65535)
    registry_port: int = Field(0, ge=0, le=65535)
    # The gateway's Prometheus metrics (on 127.0.0.1; `lpx top` reads per-status rates from it). 0: as above.
    gateway_metrics_port: int = Field(0, ge=0, le=65535)
    # Workers per pool; None: what fits the machine (cores and memory, see `worker_memory_gib`).
    workers: int | None = Field(None, ge=1)
    # Host memory one vLLM CPU worker takes (weights, 1 GiB KV cache, the engine process): sizing only.
    worker_memory_gib: float = Field(4.0, gt=0)
    # The eval gate (an engine too), the trainer (torch) and the small services, together.
    fixed_memory_gib: float = Field(6.0, ge=0)
    max_workers: int = Field(4, ge=1, description="cap of the default worker count")
    # A service exiting again within this window after its last start waits before the next (doubling
    # from 1 s up to `backoff_max_s`): a crash loop does not spin.
    backoff_window_s: float = Field(60.0, gt=0)
    backoff_max_s: float = Field(30.0, gt=0)
    # Restarts within `backoff_window_s * 2` at which `lpx ps` calls a service crash-looping.
    crash_loop_restarts: int = Field(3, ge=1)
    start_timeout_s: float = Field(300.0, gt=0, description="per start-up step (a vLLM engine loads in ~1 min)")
