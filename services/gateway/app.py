"""The gateway process: the Gateway (NATS connection, resolver cache, pool view, dispatcher, re-router,
submission consumer) and the FastAPI app factory that serves the OpenAI-compatible API on top of it."""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from libs.bus.link import BrokerLink
from libs.contracts import AdapterRef, ChatMessage, InferenceRequest, SamplingParams, TenantLimits, subjects
from libs.contracts.deadline import deadline_headers
from libs.telemetry import Telemetry, setup_telemetry
from services.gateway import errors
from services.gateway.auth import tenant_of
from services.gateway.demand import DemandPublisher, demand_bucket_config
from services.gateway.dispatch import Dispatcher, DispatchSettings, Job
from services.gateway.errors import GatewayError
from services.gateway.limit_sync import LimitSync
from services.gateway.limits import TenantLimiter
from services.gateway.metrics import GatewayMetrics
from services.gateway.pool_view import PoolView
from services.gateway.reroute import Rerouter
from services.gateway.resolver_cache import ResolverCache
from services.gateway.settings import GatewaySettings
from services.gateway.submissions import SubmissionConsumer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Prepared:
    """An authenticated caller and what its `model` means."""

    tenant: str
    model: str
    base_model: str
    adapter: AdapterRef | None  # None: the base model itself
    limits: TenantLimits | None = None  # the tenant's own (None: the pool defaults)
    api_key: str = field(default="", repr=False)  # to check the key again after a wait in a full pool

    @property
    def expected_digest(self) -> str | None:
        return self.adapter.digest if self.adapter else None


class Gateway:
    def __init__(self, settings: GatewaySettings, telemetry: Telemetry | None = None) -> None:
        self.settings = settings
        self.telemetry = telemetry or setup_telemetry(
            "gateway", metrics_port=settings.metrics_port, metrics_host=settings.metrics_host, set_global=False
        )
        self.tracer = self.telemetry.tracer("loraplex.gateway")
        self.metrics = GatewayMetrics.create(self.telemetry.meter("loraplex.gateway"))
        self.started = False

    async def start(self) -> None:
        s = self.settings
        self.loop = asyncio.get_running_loop()  # for code embedding the gateway in another thread
        self.link = BrokerLink(s.connections, "gateway", buckets=[demand_bucket_config()])
        self.nc = await self.link.connect()
        self.js = self.link.js
        self.cache = ResolverCache(
            self._request,
            ttl_s=s.resolve_ttl_s,
            negative_ttl_s=s.negative_ttl_s,
            timeout_s=s.resolve_timeout_s,
            max_entries=s.cache_max_entries,
            refresh_after_s=s.resolve_refresh_after_s if s.resolve_refresh_after_s < s.resolve_ttl_s else None,
            keep_warm_s=s.resolve_keep_warm_s,
            on_lookup=lambda o: self.metrics.resolve_lookups.add(1, {"outcome": o}),
        )
        self.cache.start()
        self._events = await self.nc.subscribe(subjects.ADAPTER_EVENTS, cb=self._on_event)
        self._tenant_events = await self.nc.subscribe(subjects.TENANT_EVENTS, cb=self._on_tenant_event)
        self.limiter = TenantLimiter(s.default_limits(), on_throttle=self._throttled)
        self.limit_sync = LimitSync(self.nc, self.limiter, s.gateway_id, interval_s=s.limit_sync_s)
        if s.limit_sync_s > 0:
            await self.limit_sync.start()
        self.weights: dict[str, float] = {}  # tenant -> its fair-share weight, as last resolved
        self.pools = PoolView(self.js, staleness_s=s.heartbeat_staleness_s, poll_s=s.pool_poll_s)
        self.dispatcher = Dispatcher(
            self.nc, self.js, self.pools, self.metrics, DispatchSettings.of_gateway(s), tracer=self.tracer
        )
        if self.dispatcher.fair is not None:
            self.dispatcher.fair.on_wait = self._fair_wait
            self.dispatcher.fair.weight_of = lambda tenant: self.weights.get(tenant, 1.0)
            self.metrics.observe_fair_queue(self.dispatcher.fair)
        # While the broker is away the view cannot see heartbeats: it keeps the workers it knew instead
        # of declaring them dead, and results published meanwhile are looked up once it is back.
        self.link.on_lost(self.pools.blind)
        self.link.on_back(self.dispatcher.catch_up)
        self.demand = DemandPublisher(
            self.js, s.gateway_id, publish_every_s=s.demand_publish_s, half_life_s=s.demand_half_life_s
        )
        self.dispatcher.on_routed = self.demand.seen
        self.rerouter = Rerouter(self.dispatcher, drain_grace_s=s.drain_grace_s)
        self.pools.on_dead = self.rerouter.on_dead
        await self.dispatcher.start()
        await self.pools.start()
        self.submissions = SubmissionConsumer(self, durable=s.submit_durable, concurrency=s.submit_concurrency)
        await self.submissions.start()
        if s.demand_publish_s > 0:
            self.demand.start()
        self.started = True
        log.info("gateway ready", extra={"workers": len(self.pools.live)})

    async def stop(self) -> None:
        if not self.started:
            return
        await self.submissions.stop()
        await self.demand.stop()
        await self.limit_sync.stop()
        await self.pools.stop()
        await self.dispatcher.stop()
        await self.cache.stop()
        await self.link.close()
        self.telemetry.shutdown()
        self.started = False

    async def _request(self, subject: str, payload: bytes, timeout: float) -> bytes:
        # The deadline lets the registry skip this request once the gateway no longer waits for it.
        return (await self.nc.request(subject, payload, timeout=timeout, headers=deadline_headers(timeout))).data

    async def _on_event(self, msg) -> None:
        self.cache.on_event(msg.data)

    async def _on_tenant_event(self, msg) -> None:
        """Limits changed or a key revoked: the tenant's next request asks the registry again."""
        self.cache.on_tenant_event(msg.data)

    def _fair_wait(self, tenant: str, tier: str, waited_s: float) -> None:
        self.metrics.fair_wait_s.record(waited_s, {"tenant": tenant, "tier": tier})

    def _throttled(self, tenant: str, limit: str) -> None:
        self.metrics.throttled.add(1, {"tenant": tenant, "limit": limit})

    # --- what the API layers call --------------------------------------------------------------
    def base_models(self) -> set[str]:
        return set(self.settings.base_models) | self.pools.base_models()

    async def prepare(self, api_key: str, model: str) -> Prepared:
        """Authenticate the key and resolve `model` (an alias of the caller's tenant or a base model)."""
        tenant = tenant_of(api_key)
        if tenant is None:
            raise errors.bad_key()
        if not model:
            raise errors.bad_request("you must provide a model parameter", "model")
        if model in self.base_models():
            auth = await self.cache.authenticate(tenant, api_key)
            if not auth.ok:
                raise _refusal(auth.code, model)
            return self._prepared(Prepared(tenant, model, model, None, auth.limits, api_key))
        try:
            subjects.token(model)
        except ValueError:
            raise errors.unknown_model(model) from None
        reply = await self.cache.resolve(tenant, model, api_key)
        if not reply.found or reply.adapter is None:
            raise _refusal(reply.code, model)
        return self._prepared(Prepared(tenant, model, reply.adapter.base_model, reply.adapter, reply.limits, api_key))

    def _prepared(self, prepared: Prepared) -> Prepared:
        weight = prepared.limits.weight if prepared.limits and prepared.limits.weight else 1.0
        if weight == 1.0:
            self.weights.pop(prepared.tenant, None)
        else:
            self.weights[prepared.tenant] = weight
        return prepared

    async def still_allowed(self, prepared: Prepared) -> None:
        """After a wait for a full pool: 401/404 when the key was revoked or the model went away
        meanwhile (a revocation's event dropped the cached answer, so this asks the registry)."""
        await self.prepare(prepared.api_key, prepared.model)

    async def models(self, api_key: str) -> tuple[str, list[str]]:
        tenant = tenant_of(api_key)
        if tenant is None:
            raise errors.bad_key()
        auth = await self.cache.authenticate(tenant, api_key)
        if not auth.ok:
            raise _refusal(auth.code, "")
        return tenant, sorted(self.base_models()) + list(auth.aliases)

    def check_prompt(self, prompt: str | None, messages: list[ChatMessage] | None) -> int:
        """The prompt's size in characters, or 400 when it is empty or too long."""
        if prompt is None and not messages:
            raise errors.bad_request("either a prompt or at least one message is required", "messages")
        size = len(prompt or "") + sum(len(m.content) for m in messages or ())
        if size > self.settings.max_prompt_chars:
            raise errors.bad_request(
                f"the prompt is {size} characters; this gateway accepts at most {self.settings.max_prompt_chars}",
                "messages",
                "context_length_exceeded",
            )
        return size

    async def dispatch(
        self,
        prepared: Prepared,
        *,
        request_id: str,
        prompt: str | None,
        messages: list[ChatMessage] | None,
        sampling: SamplingParams,
        deadline: float,
        stream: bool,
        interactive: bool = True,
        refuse_early: bool | None = None,
        fresh: bool = False,
    ) -> Job:
        """`fresh`: `request_id` was minted here for this request (an HTTP one), never dispatched before."""
        request = InferenceRequest(
            request_id=request_id,
            tenant_id=prepared.tenant,
            base_model=prepared.base_model,
            adapter=prepared.adapter,
            prompt=prompt,
            messages=messages,
            sampling=sampling,
            stream=stream,
            deadline=deadline,
            reply_to=self.settings.gateway_id,
        )
        # HTTP requests the pool cannot finish in time are refused at once; async submissions queue.
        return await self.dispatcher.submit(
            request,
            rank=prepared.adapter.rank if prepared.adapter else None,
            stream=stream,
            interactive=interactive,
            refuse_early=interactive if refuse_early is None else refuse_early,
            after_wait=lambda: self.still_allowed(prepared),
            fresh=fresh,
        )


def _refusal(code: str, model: str) -> GatewayError:
    if code == "unauthorized":
        return errors.bad_key()
    if code == "unavailable":
        return errors.unavailable(
            "the adapter registry is unavailable and nothing is cached for this request", "registry_unavailable"
        )
    if code == "not_active":
        return GatewayError(404, f"The model '{model}' has no active version yet.", "model_not_active", "model")
    return errors.unknown_model(model)


def create_app(settings: GatewaySettings | None = None, gateway: Gateway | None = None) -> FastAPI:
    from services.gateway.openai_api import router

    settings = settings or GatewaySettings.load()
    gw = gateway or Gateway(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await gw.start()
        try:
            yield
        finally:
            await gw.stop()

    app = FastAPI(title="loraplex gateway", version="0.1.0", lifespan=lifespan)
    app.state.gateway = gw

    @app.exception_handler(GatewayError)
    async def gateway_error(_: Request, exc: GatewayError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        # FastAPI's own refusals (a body that is not JSON, an unknown path or method) in OpenAI's shape too.
        codes = {400: "invalid_request", 404: "not_found", 405: "method_not_allowed"}
        return GatewayError(exc.status_code, str(exc.detail), codes.get(exc.status_code, "http_error")).response()

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        from services.gateway.openai_requests import describe_invalid

        message, param = describe_invalid(exc.errors()[0] if exc.errors() else {})
        return errors.bad_request(message, param).response()

    @app.get("/healthz")
    async def healthz() -> dict:
        return {"status": "ok"}

    @app.get("/readyz", response_model=Readiness, responses={503: {"model": Readiness, "description": "no broker"}})
    async def readyz() -> JSONResponse:
        """Ready while connected to the broker (liveness, /healthz, stays up during an outage)."""
        broker = gw.started and gw.link.connected
        live = gw.pools.live if gw.started else {}
        pools: dict[str, int] = {}
        for beat in live.values():
            pools[beat.pool] = pools.get(beat.pool, 0) + 1
        body = {
            "ready": broker,
            "workers": len(live),
            "pools": pools,
            "broker": "connected" if broker else "unreachable",
        }
        return JSONResponse(body, status_code=200 if broker else 503)

    app.include_router(router)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.openapi = lambda: _openapi(app)
    return app


class BodyLimit:
    """Refuse an oversized body from its Content-Length, before it is read and parsed.

    A plain ASGI middleware, not Starlette's `BaseHTTPMiddleware` (`app.middleware("http")`): that one
    relays every chunk of a streamed response through a memory stream and a task switch, CPU paid for
    every token of every streamed answer."""

    def __init__(self, app, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            length = dict(scope.get("headers") or ()).get(b"content-length", b"").decode("latin-1")
            if length.isdigit() and int(length) > self.max_bytes:
                message = f"The request body is {length} bytes; this gateway accepts at most {self.max_bytes}."
                await GatewayError(413, message, "request_too_large").response()(scope, receive, send)
                return
        await self.app(scope, receive, send)


class Readiness(BaseModel):
    ready: bool
    workers: int = Field(description="live workers this gateway sees")
    broker: str = Field(description="connected or unreachable")


def _openapi(app: FastAPI) -> dict:
    """FastAPI documents 422 for every route with a body or parameters; the gateway answers invalid
    requests with 400 in OpenAI's shape instead (documented per route), so 422 is never sent."""
    if app.openapi_schema is None:
        from fastapi.openapi.utils import get_openapi

        schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
        for operations in schema["paths"].values():
            for operation in operations.values():
                operation["responses"].pop("422", None)
        for unused in ("HTTPValidationError", "ValidationError"):
            schema.get("components", {}).get("schemas", {}).pop(unused, None)
        app.openapi_schema = schema
    return app.openapi_schema
