"""The registry's HTTP admin API (FastAPI; OpenAPI docs at /docs and /openapi.json): the app, assembled
from one routes module per resource (services/registry/routes/).

Every /v1 route needs `Authorization: Bearer <admin token>` except resolution, which also accepts the
tenant's own API key. Errors are JSON `{"error": <code>, "detail": <message>}` with a 4xx status
(503 when the database is unavailable).
"""

from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import FastAPI, Request

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
    usage,
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
    migrations,
    resolve,
)


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
