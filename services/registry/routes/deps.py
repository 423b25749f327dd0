"""What every route module shares: the request's context, the admin check, path parameters and the
error entries routes document."""

from __future__ import annotations

import hmac
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Path, Request
from pydantic import Field

from services.registry.context import RegistryContext
from services.registry.errors import Unauthorized
from services.registry.http_errors import PG_INT_MAX, documented

# Names are checked by the registry (422 `bad_name` naming the rule); the pattern is documented here
# so that generated clients and fuzzers know it, not enforced twice.
NAME_PATTERN = r"^[a-z0-9][a-z0-9-]{0,62}$"
NAME_DOC = {"pattern": NAME_PATTERN, "description": "1-63 lowercase letters, digits and '-'"}
KEY_ID_PATTERN = r"^[0-9a-f]{16}$"

# Errors a route documents beyond every admin route's 400/401/422/503.
LOOKUP = documented(404)  # names something that may not exist
CHANGES = documented(404, 409)  # ... and changes state that may not allow it

Name = Annotated[
    str,
    Path(pattern=NAME_PATTERN, description="1-63 lowercase letters, digits and '-', starting with a letter or digit"),
]
VersionNumber = Annotated[int, Path(ge=1, le=PG_INT_MAX, description="version number (1, 2, ...)")]


def name_field() -> Any:
    return Field(json_schema_extra=NAME_DOC)


def get_ctx(request: Request) -> RegistryContext:
    return request.app.state.ctx


Ctx = Annotated[RegistryContext, Depends(get_ctx)]


def bearer(authorization: str | None) -> str | None:
    if authorization and authorization.lower().startswith("bearer "):
        return authorization[7:].strip()
    return None


def is_admin(ctx: RegistryContext, authorization: str | None) -> bool:
    expected, given = ctx.settings.admin_secret(), bearer(authorization)
    return bool(expected and given and hmac.compare_digest(expected.encode(), given.encode()))


def require_admin(ctx: Ctx, authorization: Annotated[str | None, Header()] = None) -> None:
    if not ctx.settings.admin_secret():
        raise Unauthorized("the admin API is disabled: set LPX_REGISTRY_ADMIN_TOKEN on the registry")
    if not is_admin(ctx, authorization):
        raise Unauthorized("admin token required: send 'Authorization: Bearer <LPX_REGISTRY_ADMIN_TOKEN>'")


def admin_router() -> APIRouter:
    """A /v1 router whose every route needs the admin token."""
    return APIRouter(prefix="/v1", dependencies=[Depends(require_admin)], responses=documented(400, 401, 422, 503))
