"""Who may act on the registry and what they did: scoped registry credentials and the audit trail
(SQLModel tables and the shapes the API returns; the schema is in migration 0008)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Column, DateTime, Text
from sqlalchemy.dialects.postgresql import JSONB
from sqlmodel import Field, SQLModel

from services.registry.models import utcnow

ADMIN = "admin"  # the platform team: everything
MAINTAINER = "maintainer"  # one tenant's ML team: its datasets, versions, aliases, usage, keys
SCOPES = (ADMIN, MAINTAINER)


class RegistryCredential(SQLModel, table=True):
    """A registry credential: only the hash of its secret is stored; `token_id` (not secret) finds it."""

    __tablename__ = "registry_credentials"

    id: int | None = Field(default=None, primary_key=True)
    token_id: str = Field(max_length=32, unique=True)
    token_hash: str = Field(max_length=64)
    name: str = Field(max_length=200)
    scope: str = Field(max_length=16)
    tenant_id: int | None = Field(default=None, foreign_key="tenants.id", index=True, nullable=True)
    created_by: str = Field(max_length=200)
    created_at: datetime = Field(default_factory=utcnow, sa_type=DateTime(timezone=True), nullable=False)
    expires_at: datetime | None = Field(default=None, sa_type=DateTime(timezone=True), nullable=True)
    last_used_at: datetime | None = Field(default=None, sa_type=DateTime(timezone=True), nullable=True)
    revoked_at: datetime | None = Field(default=None, sa_type=DateTime(timezone=True), nullable=True)


class CredentialPublic(SQLModel):
    token_id: str
    name: str
    scope: str = Field(description="admin (everything) or maintainer (one tenant)")
    tenant: str | None = None
    created_by: str
    created_at: datetime
    expires_at: datetime | None = None
    last_used_at: datetime | None = None
    revoked_at: datetime | None = None


class AuditEntry(SQLModel, table=True):
    """One change of state, written in the transaction that made it. Append-only: no route updates or
    deletes an entry, and a trigger refuses UPDATE and DELETE in the database."""

    __tablename__ = "audit_log"

    id: int | None = Field(default=None, sa_column=Column(BigInteger, primary_key=True, autoincrement=True))
    at: datetime = Field(default_factory=utcnow, sa_type=DateTime(timezone=True), nullable=False)
    actor: str = Field(max_length=200, description="the credential's name (never its secret)")
    scope: str = Field(max_length=16, description="admin, maintainer or service (the registry's own consumers)")
    tenant: str | None = Field(default=None, max_length=63, nullable=True, index=True)
    action: str = Field(max_length=64)
    target: str = Field(sa_column=Column(Text, nullable=False))
    before: dict | None = Field(default=None, sa_column=Column(JSONB, nullable=True))
    after: dict | None = Field(default=None, sa_column=Column(JSONB, nullable=True))
    request_id: str | None = Field(default=None, max_length=200, nullable=True)


class AuditPublic(SQLModel):
    id: int
    at: datetime
    actor: str
    scope: str
    tenant: str | None = None
    action: str
    target: str
    before: dict | None = None
    after: dict | None = None
    request_id: str | None = None
