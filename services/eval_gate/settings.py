"""Eval gate settings (env prefix LPX_EVAL_GATE_). The engine part mirrors the pool's workers
(LPX_WORKER_*): the gate must load adapters exactly as serving will."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from libs.lora.validate import DEFAULT_ALLOWED_DTYPES, Policy
from libs.paths import lpx_home, models_dir
from libs.settings import ServiceSettings


def _default_gate_id() -> str:
    host = "".join(c if c.isalnum() or c == "-" else "-" for c in socket.gethostname())[:40]
    return f"gate-{host}-{os.getpid()}"


class EvalGateSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="LPX_EVAL_GATE_", extra="ignore")

    gate_id: str = Field(default_factory=_default_gate_id)
    # --- which versions this gate evaluates: those of one base model, like a worker pool ----------
    base_model: str = "smollm2-135m"
    model_path: Path | None = Field(None, description="base checkpoint dir; default $LPX_HOME/models/<base_model>")
    # --- the pool's engine and policy --------------------------------------------------------------
    device: str = "auto"
    max_lora_rank: int = 16
    allowed_dtypes: list[str] = Field(default_factory=lambda: list(DEFAULT_ALLOWED_DTYPES))
    max_loras: int = 2  # the candidate and the regression baseline side by side
    max_cpu_loras: int = 4
    max_model_len: int = 2048
    cpu_kvcache_gib: int = 1
    # --- criteria ----------------------------------------------------------------------------------
    default_threshold: float = Field(
        0.8, ge=0, le=1, description="eval-case pass rate a version needs, unless its tenant sets its own"
    )
    regression_margin: float = Field(
        0.1, ge=0, le=1, description="how much lower than the active version's pass rate a new version may score"
    )
    loglik_margin: float = Field(
        0.5,
        ge=0,
        description="how much lower (nats/token) than the active version's mean log-likelihood a new version may score",
    )
    max_new_tokens: int = Field(48, ge=1, description="greedy answer length per eval case")
    # The value check: every eval case also runs on the base model alone; the adapter's lift is its pass
    # rate minus the base model's. None (default): the lift is reported, never a reason to reject.
    min_lift: float | None = Field(None, ge=-1.0, le=1.0, description="pass-rate lift over the base model required")
    parity_prompts: int = Field(2, ge=0, description="prompts compared between vLLM and transformers+peft")
    parity_tokens: int = Field(16, ge=1)
    parity_min_agreement: float = Field(
        0.75, ge=0, le=1, description="matching leading tokens / output length, for outputs that are not identical"
    )
    # --- consumption -------------------------------------------------------------------------------
    durable: str | None = Field(None, description="JetStream durable; default lpx-eval-gate-<base_model>")
    deliver_policy: str = Field("all", description="'all' (production) or 'new' (tests)")
    ack_wait_s: float = Field(60.0, gt=0, description="redelivery after this long without a keep-alive")
    eval_timeout_s: float = Field(900.0, gt=0, description="an evaluation running longer is a rejection")
    registry_timeout_s: float = 10.0
    work_dir: Path | None = None
    metrics_port: int = 0

    def resolved_model_path(self) -> Path:
        return self.model_path or models_dir() / self.base_model

    def resolved_work_dir(self) -> Path:
        return self.work_dir or lpx_home() / "eval-gate" / self.gate_id

    def resolved_durable(self) -> str:
        return self.durable or f"lpx-eval-gate-{self.base_model}".replace(".", "-")

    def policy(self) -> Policy:
        return Policy(max_rank=self.max_lora_rank, allowed_dtypes=tuple(self.allowed_dtypes))
