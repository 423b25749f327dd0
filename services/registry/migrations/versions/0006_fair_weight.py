"""Per-tenant weight in the fair share of a full pool.

Revision ID: 0006_fair_weight
Revises: 0005_usage
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006_fair_weight"
down_revision = "0005_usage"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # NULL is an equal share (weight 1); a stored weight is positive (the API refuses 0 and negatives).
    op.add_column("tenants", sa.Column("fair_weight", sa.Float, nullable=True))
    op.create_check_constraint("ck_tenants_fair_weight_positive", "tenants", "fair_weight IS NULL OR fair_weight > 0")


def downgrade() -> None:
    op.drop_constraint("ck_tenants_fair_weight_positive", "tenants")
    op.drop_column("tenants", "fair_weight")
