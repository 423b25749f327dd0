"""The registry schema (SQLModel tables) and the public shapes the API returns.

Tables follow the `XBase -> X(table=True) -> XPublic` ladder where a public shape differs from the
row (secrets and internal ids stay out of responses). Adapter versions are immutable in everything
but their lifecycle columns; the migration enforces that with a trigger, not only this code.
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum

from sqlalchemy import BigInteger, Column, DateTime, ForeignKey, Index, Integer, Text, UniqueConstraint, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlmodel import Field, SQLModel


def utcnow() -> datetime:
    return datetime.now(UTC)


def _ts(nullable: bool = False):
    """A timezone-aware timestamp column: now() by default, or an optional one that starts empty."""
    if nullable:
        return Field(default=None, sa_type=DateTime(timezone=True), nullable=True)
    return Field(default_factory=utcnow, sa_type=DateTime(timezone=True), nullable=False)


class VersionStatus(StrEnum):
    PENDING = "pending"
    EVALUATING = "evaluating"
    ACTIVE = "active"
    REJECTED = "rejected"
    RETIRED = "retired"


class AliasKind(StrEnum):
    PINNED = "pinned"  # always one version: `<adapter>-v<N>`
    FOLLOW = "follow"  # the adapter's current active version: `<adapter>` or a name the tenant chose


# --- tenants and their API keys ------------------------------------------------------------------
class TenantBase(SQLModel):
    name: str = Field(max_length=63, unique=True)


class Tenant(TenantBase, table=True):
    __tablename__ = "tenants"

    id: int | None = Field(default=None, primary_key=True)
    created_at: datetime = _ts()
    # The eval-case pass rate a new version needs (None: the eval gate's default).
    eval_threshold: float | None = Field(default=None, nullable=True)
    # Limits at the gateway (None: the pool default, the gateways' settings).
    rps_limit: float | None = Field(default=None, nullable=True)
    tpm_limit: int | None = Field(default=None, nullable=True)
    concurrency_limit: int | None = Field(default=None, nullable=True)
    # Share of a full pool relative to the other tenants (None: 1, an equal share).
    fair_weight: float | None = Field(default=None, nullable=True)
    # The eval gate's value check: the pass-rate lift over the base model a new version needs (None:
    # the gate's setting), and the system prompt the base model is also scored with (None: none).
    min_lift: float | None = Field(default=None, nullable=True)
    system_prompt: str | None = Field(default=None, sa_type=Text, nullable=True)


class TenantPublic(TenantBase):
    created_at: datetime
    eval_threshold: float | None = None
    rps_limit: float | None = None
    tpm_limit: int | None = None
    concurrency_limit: int | None = None
    fair_weight: float | None = None
    min_lift: float | None = None
    system_prompt: str | None = None


class ApiKey(SQLModel, table=True):
    """Only the hash of the secret is stored; `key_id` (not secret) finds the row."""

    __tablename__ = "api_keys"

    id: int | None = Field(default=None, primary_key=True)
    tenant_id: int = Field(foreign_key="tenants.id", index=True)
    key_id: str = Field(max_length=32, unique=True)
    key_hash: str = Field(max_length=64)
    # "inference" (the gateway's API key) or "nats" (the password of the tenant's broker connection).
    kind: str = Field(default="inference", max_length=16)
    created_at: datetime = _ts()
    revoked_at: datetime | None = _ts(nullable=True)
    # Set when a NATS credential connects (the auth callout); an inference key leaves it empty.
    last_used_at: datetime | None = _ts(nullable=True)


# --- base models ---------------------------------------------------------------------------------
class BaseModelBase(SQLModel):
    name: str = Field(max_length=63, unique=True)
    architecture: str
    num_layers: int
    # {module: [in_features, out_features]} per layer, what every shape check compares against.
    module_shapes: dict = Field(sa_type=JSONB)
    checksum: str = Field(max_length=64, description="sha256 of the model's config.json (or of the spec)")
    source: str = ""


class BaseModelRow(BaseModelBase, table=True):
    __tablename__ = "base_models"

    id: int | None = Field(default=None, primary_key=True)
    spec: dict = Field(sa_type=JSONB, description="the BaseModelSpec fields, to rebuild it for validation")
    created_at: datetime = _ts()


class BaseModelPublic(BaseModelBase):
    created_at: datetime


# --- adapters, versions, aliases -----------------------------------------------------------------
class Adapter(SQLModel, table=True):
    __tablename__ = "adapters"
    __table_args__ = (UniqueConstraint("tenant_id", "name", name="uq_adapters_tenant_name"),)

    id: int | None = Field(default=None, primary_key=True)
    tenant_id: int = Field(foreign_key="tenants.id", index=True)
    name: str = Field(max_length=63)
    latest_number: int = 0  # the last version number handed out (numbers are never reused)
    # The version that follow-aliases resolve to (None until one is active). A circular reference
    # with adapter_versions, hence the separately named constraint.
    current_version_id: int | None = Field(
        default=None,
        sa_column=Column(
            Integer,
            ForeignKey("adapter_versions.id", use_alter=True, name="fk_adapters_current_version"),
            nullable=True,
        ),
    )
    created_at: datetime = _ts()


class AdapterVersion(SQLModel, table=True):
    __tablename__ = "adapter_versions"
    __table_args__ = (
        UniqueConstraint("adapter_id", "digest", name="uq_versions_adapter_digest"),
        UniqueConstraint("adapter_id", "number", name="uq_versions_adapter_number"),
    )

    id: int | None = Field(default=None, primary_key=True)
    adapter_id: int = Field(foreign_key="adapters.id", index=True)
    number: int
    # --- immutable content (a trigger refuses updates of these) ---
    digest: str = Field(max_length=64, index=True)
    base_model_id: int = Field(foreign_key="base_models.id")
    base_model: str = Field(max_length=63)
    rank: int
    alpha: float
    target_modules: list = Field(sa_type=JSONB)
    dtype: str = Field(max_length=32)
    size_bytes: int = Field(sa_type=BigInteger)
    object_key: str
    file_digests: dict = Field(sa_type=JSONB)
    created_at: datetime = _ts()
    # The dataset it was trained from (its eval split is what the gate evaluates; None: pushed by
    # hand, evaluated on the tenant's newest dataset with eval cases).
    dataset_id: int | None = Field(default=None, foreign_key="datasets.id", nullable=True)
    # --- lifecycle (mutable, only through services.registry.lifecycle) ---
    status: VersionStatus = Field(default=VersionStatus.PENDING, sa_type=Text)
    status_reason: str = ""
    status_changed_at: datetime = _ts()
    eval_report: dict | None = Field(default=None, sa_type=JSONB)
    eval_event_id: str | None = Field(default=None, max_length=64)
    override_by: str | None = None
    override_reason: str | None = None
    override_at: datetime | None = _ts(nullable=True)


class Alias(SQLModel, table=True):
    __tablename__ = "aliases"
    __table_args__ = (UniqueConstraint("tenant_id", "name", name="uq_aliases_tenant_name"),)

    id: int | None = Field(default=None, primary_key=True)
    tenant_id: int = Field(foreign_key="tenants.id", index=True)
    name: str = Field(max_length=80)
    kind: AliasKind = Field(sa_type=Text)
    adapter_id: int = Field(foreign_key="adapters.id", index=True)
    version_id: int | None = Field(default=None, foreign_key="adapter_versions.id")  # pinned aliases only
    created_at: datetime = _ts()


# --- datasets --------------------------------------------------------------------------------
class Dataset(SQLModel, table=True):
    __tablename__ = "datasets"
    __table_args__ = (UniqueConstraint("tenant_id", "name", name="uq_datasets_tenant_name"),)

    id: int | None = Field(default=None, primary_key=True)
    tenant_id: int = Field(foreign_key="tenants.id", index=True)
    name: str = Field(max_length=63)
    digest: str = Field(max_length=64)
    object_key: str
    size_bytes: int = Field(sa_type=BigInteger)
    examples: int
    train_examples: int = Field(default=0, sa_column_kwargs={"server_default": "0"})
    eval_cases: int = Field(default=0, sa_column_kwargs={"server_default": "0"})
    created_at: datetime = _ts()


# --- base-model migrations ------------------------------------------------------------------------
class Migration(SQLModel, table=True):
    """Retrain every adapter served on `from_base` for `to_base`; each tenant's aliases move on pass."""

    __tablename__ = "migrations"

    id: str = Field(primary_key=True, max_length=40)
    from_base: str = Field(max_length=63)
    to_base: str = Field(max_length=63)
    recipe: dict = Field(sa_type=JSONB, description="steps, seed, rank, alpha, targets of every job")
    requested_by: str = ""
    created_at: datetime = _ts()


class MigrationItem(SQLModel, table=True):
    """One adapter of a migration: its training job (one per adapter, ever) and what became of it."""

    __tablename__ = "migration_items"
    __table_args__ = (UniqueConstraint("migration_id", "adapter_id", name="uq_migration_items_adapter"),)

    id: int | None = Field(default=None, primary_key=True)
    migration_id: str = Field(foreign_key="migrations.id", index=True, max_length=40)
    tenant_id: int = Field(foreign_key="tenants.id")
    adapter_id: int = Field(foreign_key="adapters.id")
    old_version_id: int = Field(foreign_key="adapter_versions.id")
    dataset_id: int | None = Field(default=None, foreign_key="datasets.id", nullable=True)
    job_id: str = Field(max_length=128, unique=True)
    new_version_id: int | None = Field(default=None, foreign_key="adapter_versions.id", nullable=True)
    error: str | None = None
    created_at: datetime = _ts()
    updated_at: datetime = _ts()


# --- usage metering ------------------------------------------------------------------------------
class UsageRecord(SQLModel, table=True):
    """One answered request, counted once: the request id is the key, so a redelivered or re-routed
    result (a second worker's answer to the same request) is not counted again."""

    __tablename__ = "usage_records"
    __table_args__ = (Index("ix_usage_tenant_hour", "tenant", "hour"),)

    request_id: str = Field(primary_key=True, max_length=64)
    tenant: str = Field(max_length=63)
    adapter_digest: str | None = Field(default=None, max_length=64, nullable=True)
    base_model: str = Field(max_length=63)
    hour: datetime = Field(sa_type=DateTime(timezone=True))  # the hour the answer was recorded in (UTC)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ok: bool = True
    error_code: str | None = Field(default=None, max_length=64, nullable=True)
    worker_id: str = Field(max_length=64)
    recorded_at: datetime = _ts()


# --- the transactional outbox --------------------------------------------------------------------
class OutboxEvent(SQLModel, table=True):
    """An event written in the same transaction as the change it announces; the relay publishes it
    with Nats-Msg-Id = event_id, so a re-publish after a crash is de-duplicated by JetStream."""

    __tablename__ = "outbox"
    __table_args__ = (Index("ix_outbox_unpublished", "seq", postgresql_where=text("published_at IS NULL")),)

    seq: int | None = Field(default=None, sa_column=Column(BigInteger, primary_key=True, autoincrement=True))
    event_id: str = Field(max_length=64, unique=True)
    subject: str
    payload: str = Field(sa_type=Text, description="the exact JSON bytes to publish")
    created_at: datetime = _ts()
    published_at: datetime | None = _ts(nullable=True)
    attempts: int = 0
    last_error: str | None = None


# --- public shapes ---------------------------------------------------------------------------
class VersionPublic(SQLModel):
    tenant: str
    adapter: str
    number: int
    alias: str  # the pinned alias of this version
    digest: str
    base_model: str
    rank: int
    alpha: float
    target_modules: list[str]
    dtype: str
    size_bytes: int
    object_key: str
    dataset: str | None = None  # the dataset it was trained from, when known
    status: VersionStatus
    status_reason: str
    current: bool  # whether the adapter's follow-aliases serve this version
    eval_report: dict | None
    override_by: str | None
    override_reason: str | None
    override_at: datetime | None
    created_at: datetime
    status_changed_at: datetime


class AdapterPublic(SQLModel):
    tenant: str
    name: str
    latest_number: int
    current_version: int | None
    current_digest: str | None
    aliases: list[str]
    created_at: datetime


class AliasPublic(SQLModel):
    tenant: str
    name: str
    kind: AliasKind
    adapter: str
    version: int | None  # what it resolves to now (None: no active version yet)
    digest: str | None
