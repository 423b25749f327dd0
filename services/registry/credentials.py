"""Scoped registry credentials: random, shown once, stored as a hash (like tenants' API keys).

Format: `lpxr_<token id>_<secret>`. The token id (not secret) finds the row; the secret is 256 random
bits, so a plain sha256 is enough and comparison is constant-time. The scope and the tenant are in
the row, not in the token: nothing a caller presents can widen them. Every request looks the row up
(no cache), so a revocation holds on every registry replica from its commit on.

Scopes (services/registry/access_models.py): `admin` (everything) and `maintainer` (one tenant). The
registry's admin token from its settings stays the bootstrap admin credential.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import update
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from services.registry import audit
from services.registry.access_models import ADMIN, MAINTAINER, CredentialPublic, RegistryCredential
from services.registry.errors import Invalid, NotFound, Unauthorized
from services.registry.models import Tenant

PREFIX = "lpxr"
BOOTSTRAP = "bootstrap-admin"  # the name the settings' admin token acts under
_TOKEN = re.compile(r"lpxr_(?P<token_id>[0-9a-f]{16})_(?P<secret>[0-9a-f]{64})")
LAST_USED_EVERY = timedelta(seconds=1)  # last_used_at is written at most this often per credential


@dataclass(frozen=True)
class Principal:
    """Who a request acts as."""

    name: str
    scope: str
    tenant: str | None = None  # a maintainer's tenant
    token_id: str | None = None  # None: the bootstrap admin token

    @property
    def is_admin(self) -> bool:
        return self.scope == ADMIN

    def actor(self) -> audit.Actor:
        return audit.Actor(self.name, self.scope)


@dataclass(frozen=True)
class NewCredential:
    row: RegistryCredential
    plaintext: str  # shown once, never stored


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def looks_like_token(value: str) -> bool:
    return value.startswith(PREFIX + "_")


async def create(
    session: AsyncSession,
    *,
    name: str,
    scope: str,
    tenant: Tenant | None,
    created_by: str,
    expires_in_s: float | None = None,
) -> NewCredential:
    if scope not in (ADMIN, MAINTAINER):
        raise Invalid(f"scope must be {ADMIN!r} or {MAINTAINER!r}", code="bad_scope")
    if (scope == MAINTAINER) != (tenant is not None):
        raise Invalid("a maintainer credential names its tenant; an admin credential names none", code="bad_scope")
    token_id, secret = secrets.token_hex(8), secrets.token_hex(32)
    expires_at = datetime.now(UTC) + timedelta(seconds=expires_in_s) if expires_in_s is not None else None
    row = RegistryCredential(
        token_id=token_id,
        token_hash=hash_secret(secret),
        name=name,
        scope=scope,
        tenant_id=tenant.id if tenant is not None else None,
        created_by=created_by,
        expires_at=expires_at,
    )
    session.add(row)
    await session.flush()
    tenant_name = tenant.name if tenant is not None else None
    audit.record(
        session,
        "credential.created",
        token_id,
        tenant=tenant_name,
        after={"name": name, "scope": scope, "tenant": tenant_name, "expires_at": expires_at},
    )
    return NewCredential(row, f"{PREFIX}_{token_id}_{secret}")


async def listing(session: AsyncSession, tenant: str | None = None) -> list[CredentialPublic]:
    """Every credential (of `tenant`'s maintainers when named), oldest first; never a secret."""
    query = select(RegistryCredential, Tenant.name).outerjoin(
        Tenant, col(RegistryCredential.tenant_id) == col(Tenant.id)
    )
    if tenant is not None:
        query = query.where(Tenant.name == tenant)
    rows = (await session.exec(query.order_by(col(RegistryCredential.id)))).all()
    return [public(row, name) for row, name in rows]


async def revoke(session: AsyncSession, token_id: str, tenant: str | None = None) -> CredentialPublic:
    """Revoke a credential (idempotent). With `tenant`, only one of that tenant's: any other answers
    exactly like a missing one."""
    query = select(RegistryCredential, Tenant.name).outerjoin(
        Tenant, col(RegistryCredential.tenant_id) == col(Tenant.id)
    )
    query = query.where(RegistryCredential.token_id == token_id).with_for_update(of=RegistryCredential)
    found = (await session.exec(query)).first()
    if found is None or (tenant is not None and found[1] != tenant):
        raise NotFound(f"no registry credential {token_id!r}", code="credential_not_found")
    row, tenant_name = found
    if row.revoked_at is None:
        row.revoked_at = datetime.now(UTC)
        session.add(row)
        await session.flush()
        audit.record(
            session,
            "credential.revoked",
            token_id,
            tenant=tenant_name,
            before={"revoked_at": None},
            after={"name": row.name, "scope": row.scope, "revoked_at": row.revoked_at},
        )
    return public(row, tenant_name)


async def authenticate(session: AsyncSession, token: str) -> Principal:
    """The principal of a live credential; Unauthorized otherwise. The reason (revoked, expired) is told
    only to a caller that holds the right secret."""
    match = _TOKEN.fullmatch(token)
    refused = Unauthorized("invalid registry credential")
    if match is None:
        raise refused
    query = select(RegistryCredential, Tenant.name).outerjoin(
        Tenant, col(RegistryCredential.tenant_id) == col(Tenant.id)
    )
    found = (await session.exec(query.where(RegistryCredential.token_id == match["token_id"]))).first()
    if found is None or not hmac.compare_digest(hash_secret(match["secret"]), found[0].token_hash):
        raise refused
    row, tenant_name = found
    now = datetime.now(UTC)
    if row.revoked_at is not None:
        raise Unauthorized(f"registry credential {row.name!r} was revoked", code="credential_revoked")
    if row.expires_at is not None and row.expires_at <= now:
        raise Unauthorized(f"registry credential {row.name!r} expired", code="credential_expired")
    if row.last_used_at is None or now - row.last_used_at >= LAST_USED_EVERY:
        await session.execute(
            update(RegistryCredential).where(col(RegistryCredential.id) == row.id).values(last_used_at=now)
        )
    return Principal(row.name, row.scope, tenant_name, row.token_id)


def public(row: RegistryCredential, tenant: str | None) -> CredentialPublic:
    return CredentialPublic(
        token_id=row.token_id,
        name=row.name,
        scope=row.scope,
        tenant=tenant,
        created_by=row.created_by,
        created_at=row.created_at,
        expires_at=row.expires_at,
        last_used_at=row.last_used_at,
        revoked_at=row.revoked_at,
    )
