"""Alembic migrations on a real PostgreSQL: head matches the SQLModel tables, versions are
immutable at the database level, and the schema downgrades and upgrades cleanly."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from services.registry.db import make_engine, migrate
from tests.integration.registry.conftest import create_database

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
async def migrated(connections) -> str:
    dsn = await create_database(connections)
    await migrate(dsn)
    await migrate(dsn)  # idempotent: a second start finds the schema at head
    return dsn


async def test_head_matches_the_models(migrated):
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext
    from sqlmodel import SQLModel

    import services.registry.access_models
    import services.registry.models  # noqa: F401

    engine = make_engine(migrated)
    try:
        async with engine.connect() as conn:
            diff = await conn.run_sync(
                lambda sync: compare_metadata(
                    MigrationContext.configure(sync, opts={"compare_type": True}), SQLModel.metadata
                )
            )
    finally:
        await engine.dispose()
    assert diff == []


async def test_version_content_is_immutable_in_the_database(migrated):
    engine = make_engine(migrated)
    try:
        async with engine.begin() as conn:
            await conn.execute(text("INSERT INTO tenants (name, created_at) VALUES ('t', now());"))
            await conn.execute(
                text(
                    "INSERT INTO base_models (name, architecture, num_layers, module_shapes, checksum, source, spec,"
                    " created_at) VALUES ('b', 'x', 1, '{}', 'c', '', '{}', now())"
                )
            )
            await conn.execute(
                text("INSERT INTO adapters (tenant_id, name, latest_number, created_at) VALUES (1, 'a', 1, now())")
            )
            await conn.execute(
                text(
                    "INSERT INTO adapter_versions (adapter_id, number, digest, base_model_id, base_model, rank, alpha,"
                    " target_modules, dtype, size_bytes, object_key, file_digests, created_at, status, status_reason,"
                    " status_changed_at) VALUES (1, 1, repeat('a', 64), 1, 'b', 8, 16, '[]', 'float32', 1, 'k', '{}',"
                    " now(), 'pending', '', now())"
                )
            )
        async with engine.begin() as conn:  # lifecycle columns may change
            await conn.execute(text("UPDATE adapter_versions SET status = 'evaluating'"))
        for change in ("digest = repeat('b', 64)", "rank = 64", "object_key = 'elsewhere'", "number = 2"):
            with pytest.raises(DBAPIError, match="immutable"):
                async with engine.begin() as conn:
                    await conn.execute(text(f"UPDATE adapter_versions SET {change}"))
        with pytest.raises(DBAPIError, match="ck_versions_status"):
            async with engine.begin() as conn:
                await conn.execute(text("UPDATE adapter_versions SET status = 'serving'"))
    finally:
        await engine.dispose()


async def test_downgrade_and_upgrade_again(connections):
    import asyncio

    from alembic import command

    from services.registry.db import alembic_config

    dsn = await create_database(connections)
    await migrate(dsn)
    await asyncio.to_thread(command.downgrade, alembic_config(dsn), "base")
    engine = make_engine(dsn)
    try:
        async with engine.connect() as conn:
            tables = (await conn.execute(text("SELECT tablename FROM pg_tables WHERE schemaname = 'public'"))).all()
        assert {t for (t,) in tables} <= {"alembic_version"}
    finally:
        await engine.dispose()
    await migrate(dsn)


def _migrate_process(dsn: str, wait_s: float):
    import os
    import subprocess
    import sys

    env = {**os.environ, "LPX_PG_DSN": dsn, "LPX_REGISTRY_MIGRATE_WAIT_S": str(wait_s)}
    return subprocess.run(
        [sys.executable, "-m", "services.registry.migrate"], env=env, capture_output=True, text=True, timeout=120
    )


async def test_migrations_job_command_migrates_a_fresh_database_then_finds_it_current(connections):
    """The Helm chart's migrations Job runs `python -m services.registry.migrate` before the registry."""
    dsn = await create_database(connections)
    for _ in range(2):
        done = _migrate_process(dsn, wait_s=30)
        assert done.returncode == 0, done.stderr
    engine = make_engine(dsn)
    try:
        async with engine.connect() as conn:
            tables = set(
                (await conn.execute(text("SELECT tablename FROM pg_tables WHERE schemaname = 'public'"))).scalars()
            )
    finally:
        await engine.dispose()
    assert {"alembic_version", "tenants", "adapters", "adapter_versions"} <= tables


def test_migrations_job_command_fails_in_one_line_when_postgres_never_answers():
    from libs.stack.procs import free_port

    done = _migrate_process(f"postgresql+asyncpg://x:y@127.0.0.1:{free_port()}/none", wait_s=2)
    output = done.stdout + done.stderr
    assert done.returncode == 1
    assert "PostgreSQL unreachable" in output
    assert "Traceback" not in output
