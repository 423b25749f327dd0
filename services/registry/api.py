"""The registry's HTTP admin API (FastAPI; OpenAPI docs at /docs and /openapi.json): the app, assembled
from one routes module per resource (services/registry/routes/).

Every /v1 route needs `Authorization: Bearer <credential>`: the bootstrap admin token of the settings,
or a registry credential (services/registry/credentials.py) of the admin scope or of the maintainer
scope of the tenant the route acts on; resolution also accepts the tenant's own API key. Every change
of state is recorded in the audit trail with the request id (`X-Request-ID`, or one made here and
answered in that header). Errors are JSON `{"error": <code>, "detail": <message>}` with a 4xx status
(503 when the database is unavailable).
"""

from __future__ import annotations

import re
import uuid
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request

from services.registry import audit
from services.registry.context import FaultHooks
from services.registry.errors import TooLarge
from services.registry.http_errors import error_response, install_error_handlers
from services.registry.routes import (
    adapters,
    aliases,
    bases,
    datasets,
    health,
    keys,
    lifecycle,
    migrations,
    resolve,
    tenants,
    tokens,
    training,
    usage,
    value_check,
)
from services.registry.routes import (
    audit as audit_routes,
)
from services.registry.service import RegistryService
from services.registry.settings import RegistrySettings

MULTIPART_SLACK = 1 << 20  # form boundaries and fields on top of the adapter's own bytes
ROUTERS = (
    health,
    tenants,
    keys,
    usage,
    bases,
    adapters,
    lifecycle,
    aliases,
    datasets,
    training,
    value_check,
    migrations,
    tokens,
    audit_routes,
    resolve,
)
REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,200}")


def create_app(settings: RegistrySettings, hooks: FaultHooks | None = None, telemetry=None) -> FastAPI:
    service = RegistryService(settings, hooks=hooks, telemetry=telemetry)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.ctx = await service.start()
        try:
            yield
        finally:
            await service.stop()

    app = FastAPI(
        title="loraplex registry",
        version="1",
        lifespan=lifespan,
        description="Tenants, base models, versioned LoRA adapters, aliases and their lifecycle.",
    )
    app.state.service = service
    install_error_handlers(app)
    app.middleware("http")(_limit_push_size(settings.max_adapter_bytes))
    app.middleware("http")(_request_id)
    for module in ROUTERS:
        app.include_router(module.router)
    return app


def _limit_push_size(max_bytes: int):
    """Refuse an oversized push from its Content-Length, before the body is read and spooled."""

    async def middleware(request: Request, call_next):
        length = request.headers.get("content-length")
        if request.method == "POST" and length and length.isdigit() and int(length) > max_bytes + MULTIPART_SLACK:
            return error_response(
                TooLarge(f"request of {length} bytes is over the limit of {max_bytes} bytes (max_adapter_bytes)")
            )
        return await call_next(request)

    return middleware


async def _request_id(request: Request, call_next):
    """The request's id for the audit trail: the caller's X-Request-ID when it is a plain token, else
    a new one; answered in the same header."""
    given = request.headers.get("x-request-id", "")
    request_id = given if REQUEST_ID.fullmatch(given) else uuid.uuid4().hex
    audit.set_request_id(request_id)
    response = await call_next(request)
    response.headers["X-Request-ID"] = request_id
    return response
