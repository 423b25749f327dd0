"""Per-tenant value check: the minimum lift over the base model and the tenant's system prompt.

Revision ID: 0009_tenant_value_check
Revises: 0008_scopes_audit
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009_tenant_value_check"
down_revision = "0008_scopes_audit"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # NULL min_lift: the eval gate's setting (report only by default); NULL system_prompt: none.
    op.add_column("tenants", sa.Column("min_lift", sa.Float, nullable=True))
    op.add_column("tenants", sa.Column("system_prompt", sa.Text, nullable=True))
    op.create_check_constraint(
        "ck_tenants_min_lift_range", "tenants", "min_lift IS NULL OR (min_lift >= -1 AND min_lift <= 1)"
    )


def downgrade() -> None:
    op.drop_constraint("ck_tenants_min_lift_range", "tenants")
    op.drop_column("tenants", "system_prompt")
    op.drop_column("tenants", "min_lift")
