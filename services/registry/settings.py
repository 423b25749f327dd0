"""Registry settings (`LPX_REGISTRY_*`), on top of the shared connection settings (`LPX_*`)."""

from __future__ import annotations

from pydantic import Field, SecretStr
from pydantic_settings import SettingsConfigDict

from libs.lora.validate import DEFAULT_ALLOWED_DTYPES, Policy
from libs.settings import ServiceSettings


class RegistrySettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="LPX_REGISTRY_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = 8100
    # None refuses every admin call (fail closed) rather than leaving the admin API open.
    admin_token: SecretStr | None = None

    # --- the pool's policy (what a worker pool of this registry can serve) ---------------------
    max_rank: int = Field(16, ge=1, description="highest LoRA rank the default pool serves")
    allowed_dtypes: list[str] = Field(default_factory=lambda: list(DEFAULT_ALLOWED_DTYPES))
    max_adapter_bytes: int = Field(512 * 1024 * 1024, ge=1, description="config + weights, in bytes")

    # --- background work -----------------------------------------------------------------------
    # 2 s, not 0.5: every commit that writes an event wakes the relay at once, so the poll only catches a wake
    # that was missed (or rows a crashed replica left); each empty poll is a transaction, and at 0.5 s they
    # were half of an idle registry's CPU (8.3 -> 4.3-5.0 ms/s measured, 2026-12-07).
    outbox_poll_s: float = Field(
        2.0, gt=0, description="how often the relay looks for unpublished events besides the wake after a commit"
    )
    outbox_batch: int = Field(100, ge=1)
    active_set_every_s: float = Field(
        30.0, gt=0, description="how often the active adapter set (the workers' placement) is brought to the database"
    )
    eval_durable: str = "lpx-registry-eval"
    # Usage metering reads every result through this durable (services/registry/usage.py).
    usage_durable: str = "lpx-registry-usage"
    usage_deliver_policy: str = Field("all", description="'all' (production: every stored result) or 'new' (tests)")
    # "all" replays every stored verdict on a new durable (production); tests use "new".
    eval_deliver_policy: str = "all"
    orphan_grace_s: float = Field(3600, ge=0, description="age before an unreferenced object is swept")

    # --- cost estimates in usage reports (services/registry/cost.py) ----------------------------
    # GPU price per hour (None: the planner's default, labelled assumed).
    gpu_price_per_hour: float | None = Field(None, gt=0, le=10_000)
    # `make bench`'s worker.json: the pool's measured output tok/s per GPU (None: the planner's
    # assumed figure); a report that cannot be read is said in the estimate, never silently replaced.
    throughput_report: str | None = None

    # --- tenants' NATS connections (services/registry/nats_access.py) ---------------------------
    # The auth callout's account nkey seed (SA...): it signs the permissions of each tenant connection.
    # The server's config names its public key (`issuer`). None: tenants cannot connect to NATS.
    nats_callout_seed: SecretStr | None = None
    # A tenant connection's permissions expire after this long and the client re-authenticates (a
    # revocation also disconnects at once; this bounds one that could not reach the broker).
    nats_tenant_session_s: int = Field(3600, ge=60)
    nats_public_url: str | None = Field(None, description="the NATS URL tenants are told (default: LPX_NATS_URL)")

    # --- start-up ------------------------------------------------------------------------------
    migrate_on_start: bool = True
    # `python -m services.registry.migrate` (the chart's migrations Job) waits this long for PostgreSQL.
    migrate_wait_s: float = Field(120.0, gt=0)
    seed_catalog: bool = True

    def policy(self) -> Policy:
        return Policy(max_rank=self.max_rank, allowed_dtypes=tuple(self.allowed_dtypes))

    def admin_secret(self) -> str | None:
        return self.admin_token.get_secret_value() if self.admin_token else None
