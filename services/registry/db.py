"""Async database access (SQLAlchemy async engine over asyncpg, SQLModel sessions) and migrations."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from sqlalchemy import exc as sa_exc
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine
from sqlmodel.ext.asyncio.session import AsyncSession

MIGRATIONS_DIR = Path(__file__).with_name("migrations")

Sessions = async_sessionmaker[AsyncSession]


def make_engine(dsn: str) -> AsyncEngine:
    # pool_pre_ping: after a PostgreSQL restart, dead pooled connections are replaced instead of
    # failing the next request.
    return create_async_engine(dsn, pool_pre_ping=True, pool_size=10, max_overflow=10)


def make_sessions(engine: AsyncEngine) -> Sessions:
    return async_sessionmaker(engine, class_=AsyncSession, expire_on_commit=False)


@asynccontextmanager
async def transaction(sessions: Sessions) -> AsyncIterator[AsyncSession]:
    """One unit of work: commits on success, rolls back on any error."""
    async with sessions() as session, session.begin():
        yield session


def alembic_config(dsn: str):
    """Alembic configured in code, so migrations run from an installed package (no ini file)."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", dsn.replace("%", "%%"))
    return config


def upgrade_head(dsn: str) -> None:
    from alembic import command

    command.upgrade(alembic_config(dsn), "head")


async def migrate(dsn: str) -> None:
    # env.py drives its own event loop (asyncio.run), so it runs in a worker thread.
    await asyncio.to_thread(upgrade_head, dsn)


# Driver errors that mean "the server went away or is not accepting connections yet".
_UNAVAILABLE_NAMES = {
    "ConnectionDoesNotExistError",
    "CannotConnectNowError",
    "ConnectionFailureError",
    "PostgresConnectionError",
    "AdminShutdownError",
    "CrashShutdownError",
    "InterfaceError",
    "TooManyConnectionsError",
}


def is_unavailable(exc: BaseException) -> bool:
    """True when the database could not be reached or dropped the connection (retry later), looking
    through SQLAlchemy's wrappers down to the driver's error."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, sa_exc.DBAPIError) and current.connection_invalidated:
            return True
        if isinstance(current, OSError | ConnectionError | TimeoutError | sa_exc.InterfaceError):
            return True
        if type(current).__name__ in _UNAVAILABLE_NAMES:
            return True
        if "connection was closed" in str(current) or "connection is closed" in str(current):
            return True
        current = getattr(current, "orig", None) or current.__cause__ or current.__context__
    return False
