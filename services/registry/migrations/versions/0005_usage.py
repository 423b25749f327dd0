"""Usage metering: one row per answered request (the request id is the key: counted once).

Revision ID: 0005_usage
Revises: 0004_tenant_limits
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005_usage"
down_revision = "0004_tenant_limits"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "usage_records",
        sa.Column("request_id", sa.String(64), primary_key=True),
        sa.Column("tenant", sa.String(63), nullable=False),
        sa.Column("adapter_digest", sa.String(64), nullable=True),
        sa.Column("base_model", sa.String(63), nullable=False),
        sa.Column("hour", TS, nullable=False),
        sa.Column("prompt_tokens", sa.Integer, nullable=False),
        sa.Column("completion_tokens", sa.Integer, nullable=False),
        sa.Column("ok", sa.Boolean, nullable=False),
        sa.Column("error_code", sa.String(64), nullable=True),
        sa.Column("worker_id", sa.String(64), nullable=False),
        sa.Column("recorded_at", TS, nullable=False),
    )
    op.create_index("ix_usage_tenant_hour", "usage_records", ["tenant", "hour"])


def downgrade() -> None:
    op.drop_index("ix_usage_tenant_hour", "usage_records")
    op.drop_table("usage_records")
