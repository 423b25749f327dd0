"""Base-model migrations: one row per migration, one item per adapter (its job and its outcome).

Revision ID: 0003_migrations
Revises: 0002_eval_gate
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0003_migrations"
down_revision = "0002_eval_gate"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "migrations",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("from_base", sa.String(63), nullable=False),
        sa.Column("to_base", sa.String(63), nullable=False),
        sa.Column("recipe", JSONB, nullable=False),
        sa.Column("requested_by", sa.String, nullable=False),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_table(
        "migration_items",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("migration_id", sa.String(40), sa.ForeignKey("migrations.id"), nullable=False, index=True),
        sa.Column("tenant_id", sa.Integer, sa.ForeignKey("tenants.id"), nullable=False),
        sa.Column("adapter_id", sa.Integer, sa.ForeignKey("adapters.id"), nullable=False),
        sa.Column("old_version_id", sa.Integer, sa.ForeignKey("adapter_versions.id"), nullable=False),
        sa.Column("dataset_id", sa.Integer, sa.ForeignKey("datasets.id"), nullable=True),
        sa.Column("job_id", sa.String(128), nullable=False, unique=True),
        sa.Column("new_version_id", sa.Integer, sa.ForeignKey("adapter_versions.id"), nullable=True),
        sa.Column("error", sa.String, nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.UniqueConstraint("migration_id", "adapter_id", name="uq_migration_items_adapter"),
    )


def downgrade() -> None:
    op.drop_table("migration_items")
    op.drop_table("migrations")
