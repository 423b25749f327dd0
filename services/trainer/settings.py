"""Trainer settings (env prefix LPX_TRAINER_)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import SettingsConfigDict

from libs.paths import lpx_home, models_dir
from libs.settings import ServiceSettings


def _default_trainer_id() -> str:
    host = "".join(c if c.isalnum() or c == "-" else "-" for c in socket.gethostname())[:40]
    return f"trainer-{host}-{os.getpid()}"


class TrainerSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="LPX_TRAINER_", extra="ignore")

    trainer_id: str = Field(default_factory=_default_trainer_id)
    # Trained versions are pushed through the registry's admin API, like any other push.
    registry_url: str = "http://127.0.0.1:8100"
    admin_token: SecretStr | None = None
    registry_timeout_s: float = 120.0
    models_root: Path | None = Field(
        None, description="base checkpoints as <root>/<base_model>; default $LPX_HOME/models"
    )
    device: str = Field("auto", description="auto (GPU when present) | cpu | cuda")
    max_length: int = Field(256, ge=16, description="tokens per training example")
    work_dir: Path | None = None
    durable: str = "lpx-trainer"
    ack_wait_s: float = Field(60.0, gt=0, description="redelivery after this long without a keep-alive")
    retry_delay_s: float = 5.0
    metrics_port: int = 0

    def base_path(self, base_model: str) -> Path:
        return (self.models_root or models_dir()) / base_model

    def resolved_work_dir(self) -> Path:
        return self.work_dir or lpx_home() / "trainer" / self.trainer_id

    def admin_secret(self) -> str | None:
        return self.admin_token.get_secret_value() if self.admin_token else None
