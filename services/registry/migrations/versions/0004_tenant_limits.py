"""Per-tenant limits at the gateway: requests per second, tokens per minute, requests in flight.

Revision ID: 0004_tenant_limits
Revises: 0003_migrations
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004_tenant_limits"
down_revision = "0003_migrations"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("tenants", sa.Column("rps_limit", sa.Float, nullable=True))
    op.add_column("tenants", sa.Column("tpm_limit", sa.Integer, nullable=True))
    op.add_column("tenants", sa.Column("concurrency_limit", sa.Integer, nullable=True))
    # NULL is the pool default; a stored limit is positive (the API refuses 0 and negatives too).
    op.create_check_constraint(
        "ck_tenants_limits_positive",
        "tenants",
        "(rps_limit IS NULL OR rps_limit > 0) AND (tpm_limit IS NULL OR tpm_limit > 0)"
        " AND (concurrency_limit IS NULL OR concurrency_limit > 0)",
    )


def downgrade() -> None:
    op.drop_constraint("ck_tenants_limits_positive", "tenants")
    op.drop_column("tenants", "concurrency_limit")
    op.drop_column("tenants", "tpm_limit")
    op.drop_column("tenants", "rps_limit")
