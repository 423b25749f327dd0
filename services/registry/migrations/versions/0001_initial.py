"""Initial registry schema: tenants, API keys, base models, adapters, immutable versions, aliases,
datasets and the event outbox.

Revision ID: 0001_initial
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0001_initial"
down_revision = None
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)
STATUSES = ("pending", "evaluating", "active", "rejected", "retired")
# Everything that identifies a version's content: once written, no UPDATE may change it.
IMMUTABLE_COLUMNS = (
    "adapter_id",
    "number",
    "digest",
    "base_model_id",
    "base_model",
    "rank",
    "alpha",
    "target_modules",
    "dtype",
    "size_bytes",
    "object_key",
    "file_digests",
    "created_at",
)


def upgrade() -> None:
    op.create_table(
        "tenants",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(63), nullable=False, unique=True),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_table(
        "api_keys",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("tenant_id", sa.Integer, sa.ForeignKey("tenants.id"), nullable=False, index=True),
        sa.Column("key_id", sa.String(32), nullable=False, unique=True),
        sa.Column("key_hash", sa.String(64), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("revoked_at", TS, nullable=True),
    )
    op.create_table(
        "base_models",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(63), nullable=False, unique=True),
        sa.Column("architecture", sa.String, nullable=False),
        sa.Column("num_layers", sa.Integer, nullable=False),
        sa.Column("module_shapes", JSONB, nullable=False),
        sa.Column("checksum", sa.String(64), nullable=False),
        sa.Column("source", sa.String, nullable=False),
        sa.Column("spec", JSONB, nullable=False),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_table(
        "adapters",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("tenant_id", sa.Integer, sa.ForeignKey("tenants.id"), nullable=False, index=True),
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("latest_number", sa.Integer, nullable=False),
        sa.Column("current_version_id", sa.Integer, nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.UniqueConstraint("tenant_id", "name", name="uq_adapters_tenant_name"),
    )
    op.create_table(
        "adapter_versions",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("adapter_id", sa.Integer, sa.ForeignKey("adapters.id"), nullable=False, index=True),
        sa.Column("number", sa.Integer, nullable=False),
        sa.Column("digest", sa.String(64), nullable=False, index=True),
        sa.Column("base_model_id", sa.Integer, sa.ForeignKey("base_models.id"), nullable=False),
        sa.Column("base_model", sa.String(63), nullable=False),
        sa.Column("rank", sa.Integer, nullable=False),
        sa.Column("alpha", sa.Float, nullable=False),
        sa.Column("target_modules", JSONB, nullable=False),
        sa.Column("dtype", sa.String(32), nullable=False),
        sa.Column("size_bytes", sa.BigInteger, nullable=False),
        sa.Column("object_key", sa.String, nullable=False),
        sa.Column("file_digests", JSONB, nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("status", sa.Text, nullable=False),
        sa.Column("status_reason", sa.String, nullable=False),
        sa.Column("status_changed_at", TS, nullable=False),
        sa.Column("eval_report", JSONB, nullable=True),
        sa.Column("eval_event_id", sa.String(64), nullable=True),
        sa.Column("override_by", sa.String, nullable=True),
        sa.Column("override_reason", sa.String, nullable=True),
        sa.Column("override_at", TS, nullable=True),
        sa.UniqueConstraint("adapter_id", "digest", name="uq_versions_adapter_digest"),
        sa.UniqueConstraint("adapter_id", "number", name="uq_versions_adapter_number"),
        sa.CheckConstraint(f"status IN {STATUSES!r}", name="ck_versions_status"),
        sa.CheckConstraint("digest ~ '^[0-9a-f]{64}$'", name="ck_versions_digest"),
        sa.CheckConstraint("rank > 0", name="ck_versions_rank"),
    )
    op.create_foreign_key("fk_adapters_current_version", "adapters", "adapter_versions", ["current_version_id"], ["id"])
    op.create_table(
        "aliases",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("tenant_id", sa.Integer, sa.ForeignKey("tenants.id"), nullable=False, index=True),
        sa.Column("name", sa.String(80), nullable=False),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("adapter_id", sa.Integer, sa.ForeignKey("adapters.id"), nullable=False, index=True),
        sa.Column("version_id", sa.Integer, sa.ForeignKey("adapter_versions.id"), nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.UniqueConstraint("tenant_id", "name", name="uq_aliases_tenant_name"),
        sa.CheckConstraint(
            "(kind = 'pinned' AND version_id IS NOT NULL) OR (kind = 'follow' AND version_id IS NULL)",
            name="ck_aliases_kind",
        ),
    )
    op.create_table(
        "datasets",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("tenant_id", sa.Integer, sa.ForeignKey("tenants.id"), nullable=False, index=True),
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("object_key", sa.String, nullable=False),
        sa.Column("size_bytes", sa.BigInteger, nullable=False),
        sa.Column("examples", sa.Integer, nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.UniqueConstraint("tenant_id", "name", name="uq_datasets_tenant_name"),
    )
    op.create_table(
        "outbox",
        sa.Column("seq", sa.BigInteger, primary_key=True, autoincrement=True),
        sa.Column("event_id", sa.String(64), nullable=False, unique=True),
        sa.Column("subject", sa.String, nullable=False),
        sa.Column("payload", sa.Text, nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("published_at", TS, nullable=True),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("last_error", sa.String, nullable=True),
    )
    op.create_index("ix_outbox_unpublished", "outbox", ["seq"], postgresql_where=sa.text("published_at IS NULL"))
    _immutable_versions_trigger()


def _immutable_versions_trigger() -> None:
    changed = " OR ".join(f"NEW.{c} IS DISTINCT FROM OLD.{c}" for c in IMMUTABLE_COLUMNS)
    op.execute(f"""
        CREATE FUNCTION lpx_versions_immutable() RETURNS trigger AS $$
        BEGIN
            IF {changed} THEN
                RAISE EXCEPTION 'adapter versions are immutable: only lifecycle columns may change'
                    USING ERRCODE = 'integrity_constraint_violation';
            END IF;
            RETURN NEW;
        END $$ LANGUAGE plpgsql
    """)
    op.execute("""
        CREATE TRIGGER lpx_versions_immutable BEFORE UPDATE ON adapter_versions
        FOR EACH ROW EXECUTE FUNCTION lpx_versions_immutable()
    """)


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS lpx_versions_immutable ON adapter_versions")
    op.execute("DROP FUNCTION IF EXISTS lpx_versions_immutable()")
    op.drop_constraint("fk_adapters_current_version", "adapters", type_="foreignkey")
    for table in (
        "outbox",
        "datasets",
        "aliases",
        "adapter_versions",
        "adapters",
        "base_models",
        "api_keys",
        "tenants",
    ):
        op.drop_table(table)
