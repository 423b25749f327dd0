"""Alembic environment: async engine (asyncpg), URL from the Alembic config or LPX_PG_DSN.

Migrations run under a PostgreSQL advisory lock so that several registry replicas starting at once
apply them exactly once (the others wait, then find the schema at head).
"""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine
from sqlmodel import SQLModel

import services.registry.access_models
import services.registry.models  # noqa: F401 - these two modules register the tables on SQLModel.metadata

MIGRATION_LOCK = 0x6C70785F726567  # "lpx_reg": any constant bigint shared by every replica


def _url() -> str:
    url = context.config.get_main_option("sqlalchemy.url")
    if url:
        return url
    from libs.settings import ConnectionSettings

    return ConnectionSettings.load().pg_dsn


def _run(connection) -> None:
    context.configure(connection=connection, target_metadata=SQLModel.metadata, compare_type=True)
    with context.begin_transaction():
        context.run_migrations()


async def _run_online() -> None:
    engine = create_async_engine(_url())
    try:
        async with engine.connect() as conn:
            await conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": MIGRATION_LOCK})
            await conn.commit()
            try:
                await conn.run_sync(_run)
                await conn.commit()
            finally:
                await conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": MIGRATION_LOCK})
                await conn.commit()
    finally:
        await engine.dispose()


if context.is_offline_mode():
    context.configure(url=_url(), target_metadata=SQLModel.metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    asyncio.run(_run_online())
