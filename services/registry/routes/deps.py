"""What every route module shares: the request's context, who it acts as and what that may do (the
admin scope, a maintainer's own tenant), path parameters and the error entries routes document."""

from __future__ import annotations

import hmac
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Path, Request
from pydantic import Field

from services.registry import audit, credentials, keys
from services.registry.access_models import ADMIN
from services.registry.context import RegistryContext
from services.registry.credentials import Principal
from services.registry.db import transaction
from services.registry.errors import Forbidden, Unauthorized
from services.registry.http_errors import PG_INT_MAX, documented

# Names are checked by the registry (422 `bad_name` naming the rule); the pattern is documented here
# so that generated clients and fuzzers know it, not enforced twice.
NAME_PATTERN = r"^[a-z0-9][a-z0-9-]{0,62}$"
NAME_DOC = {"pattern": NAME_PATTERN, "description": "1-63 lowercase letters, digits and '-'"}
KEY_ID_PATTERN = r"^[0-9a-f]{16}$"

# Errors a route documents beyond every /v1 route's 400/401/403/422/503.
LOOKUP = documented(404)  # names something that may not exist
CHANGES = documented(404, 409)  # ... and changes state that may not allow it

Name = Annotated[
    str,
    Path(pattern=NAME_PATTERN, description="1-63 lowercase letters, digits and '-', starting with a letter or digit"),
]
VersionNumber = Annotated[int, Path(ge=1, le=PG_INT_MAX, description="version number (1, 2, ...)")]


def name_field() -> Any:
    return Field(json_schema_extra=NAME_DOC)


async def get_ctx(request: Request) -> RegistryContext:
    """Async: FastAPI runs a plain `def` dependency in its thread pool (a hand-off per request)."""
    return request.app.state.ctx


Ctx = Annotated[RegistryContext, Depends(get_ctx)]


def bearer(authorization: str | None) -> str | None:
    if authorization and authorization.lower().startswith("bearer "):
        return authorization[7:].strip()
    return None


def is_admin(ctx: RegistryContext, authorization: str | None) -> bool:
    """The bootstrap admin token from the registry's settings."""
    expected, given = ctx.settings.admin_secret(), bearer(authorization)
    return bool(expected and given and hmac.compare_digest(expected.encode(), given.encode()))


async def principal_of(ctx: RegistryContext, authorization: str | None) -> Principal:
    """Who the request acts as: the bootstrap admin token, or a live registry credential (looked up in
    the database on every request, so a revocation holds on every replica from its commit on)."""
    if is_admin(ctx, authorization):
        return Principal(credentials.BOOTSTRAP, ADMIN)
    token = bearer(authorization) or ""
    if keys.parse(token) is not None:
        raise Unauthorized("a tenant API key or NATS credential is for the gateway, not the registry's API")
    if credentials.looks_like_token(token):
        async with transaction(ctx.sessions) as session:
            return await credentials.authenticate(session, token)
    if not ctx.settings.admin_secret():
        raise Unauthorized(
            "a registry credential is required: send 'Authorization: Bearer <credential>' "
            "(the bootstrap admin token is disabled: LPX_REGISTRY_ADMIN_TOKEN is not set)"
        )
    raise Unauthorized(
        "admin token or registry credential required: send 'Authorization: Bearer <LPX_REGISTRY_ADMIN_TOKEN>' "
        "or a credential from 'lpx tenant token create'"
    )


async def authenticated(ctx: Ctx, authorization: Annotated[str | None, Header()] = None) -> Principal:
    principal = await principal_of(ctx, authorization)
    audit.set_actor(principal.actor())
    return principal


Who = Annotated[Principal, Depends(authenticated)]


async def require_admin(principal: Who) -> None:
    if not principal.is_admin:
        raise Forbidden(f"credential {principal.name!r} ({principal.scope}) may not do this: it needs the admin scope")


def check_tenant(principal: Principal, tenant: str | None) -> None:
    """A maintainer acts on its own tenant only. Another tenant is refused the same way whether it
    exists or not (the check is on the name, before anything is looked up)."""
    if principal.is_admin:
        return
    if tenant != principal.tenant:
        raise Forbidden(f"credential {principal.name!r} may act only on tenant {principal.tenant!r}")


async def require_tenant(request: Request, principal: Who) -> None:
    """The path's {tenant} must be the maintainer's own. A route of a tenant router without {tenant} in
    its path checks the tenant it acts on itself (tests/unit/registry/test_scopes.py lists them)."""
    if "tenant" in request.path_params:
        check_tenant(principal, request.path_params["tenant"])


ERRORS = documented(400, 401, 403, 422, 503)


def admin_router() -> APIRouter:
    """A /v1 router whose every route needs the admin scope."""
    return APIRouter(prefix="/v1", dependencies=[Depends(require_admin)], responses=ERRORS)


def tenant_router() -> APIRouter:
    """A /v1 router for the admin scope and the maintainers of the tenant each route acts on."""
    return APIRouter(prefix="/v1", dependencies=[Depends(require_tenant)], responses=ERRORS)
