"""Eval gate and training: per-tenant eval thresholds, dataset split counts, and the dataset a
version was trained from (part of the version's immutable content: provenance does not change).

Revision ID: 0002_eval_gate
Revises: 0001_initial
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002_eval_gate"
down_revision = "0001_initial"
branch_labels = None
depends_on = None

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
    "dataset_id",
)


def upgrade() -> None:
    op.add_column("tenants", sa.Column("eval_threshold", sa.Float, nullable=True))
    op.create_check_constraint(
        "ck_tenants_eval_threshold",
        "tenants",
        "eval_threshold IS NULL OR (eval_threshold >= 0 AND eval_threshold <= 1)",
    )
    op.add_column("datasets", sa.Column("train_examples", sa.Integer, nullable=False, server_default="0"))
    op.add_column("datasets", sa.Column("eval_cases", sa.Integer, nullable=False, server_default="0"))
    op.add_column("adapter_versions", sa.Column("dataset_id", sa.Integer, sa.ForeignKey("datasets.id"), nullable=True))
    _replace_trigger_function(IMMUTABLE_COLUMNS)


def _replace_trigger_function(columns: tuple[str, ...]) -> None:
    changed = " OR ".join(f"NEW.{c} IS DISTINCT FROM OLD.{c}" for c in columns)
    op.execute(f"""
        CREATE OR REPLACE FUNCTION lpx_versions_immutable() RETURNS trigger AS $$
        BEGIN
            IF {changed} THEN
                RAISE EXCEPTION 'adapter versions are immutable: only lifecycle columns may change'
                    USING ERRCODE = 'integrity_constraint_violation';
            END IF;
            RETURN NEW;
        END $$ LANGUAGE plpgsql
    """)


def downgrade() -> None:
    _replace_trigger_function(IMMUTABLE_COLUMNS[:-1])
    op.drop_column("adapter_versions", "dataset_id")
    op.drop_column("datasets", "eval_cases")
    op.drop_column("datasets", "train_examples")
    op.drop_constraint("ck_tenants_eval_threshold", "tenants", type_="check")
    op.drop_column("tenants", "eval_threshold")
