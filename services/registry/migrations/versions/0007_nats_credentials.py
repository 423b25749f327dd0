"""NATS credentials: a tenant's broker password lives beside its API keys, told apart by `kind`.

Revision ID: 0007_nats_credentials
Revises: 0006_fair_weight
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007_nats_credentials"
down_revision = "0006_fair_weight"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Every existing key is an inference key.
    op.add_column("api_keys", sa.Column("kind", sa.String(16), nullable=False, server_default="inference"))
    op.add_column("api_keys", sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True))
    op.create_check_constraint("ck_api_keys_kind", "api_keys", "kind IN ('inference', 'nats')")


def downgrade() -> None:
    op.drop_constraint("ck_api_keys_kind", "api_keys")
    op.drop_column("api_keys", "last_used_at")
    op.drop_column("api_keys", "kind")
