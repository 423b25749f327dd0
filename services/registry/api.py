"""The registry's HTTP admin API (FastAPI; OpenAPI docs at /docs and /openapi.json).

Every /v1 route needs `Authorization: Bearer <admin token>` except resolution, which also accepts the
tenant's own API key. Errors are JSON `{"error": <code>, "detail": <message>}` with a 4xx status
(503 when the database is unavailable).
"""

from __future__ import annotations

import hmac
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, File, Form, Header, Path, Query, Request, UploadFile
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from libs.contracts import AdapterRef, TenantLimits
from libs.models.catalog import BaseModelSpec
from services.registry import (
    aliases,
    base_migrations,
    bases,
    datasets,
    keys,
    lifecycle,
    orphans,
    tenants,
    usage,
    versions,
)
from services.registry.context import FaultHooks, RegistryContext
from services.registry.cost import cost_basis
from services.registry.db import transaction
from services.registry.errors import Invalid, TooLarge, Unauthorized
from services.registry.http_errors import PG_INT_MAX, documented, error_response, install_error_handlers
from services.registry.models import AliasPublic, BaseModelPublic, TenantPublic, VersionPublic
from services.registry.service import RegistryService
from services.registry.settings import RegistrySettings
from services.registry.uploads import spooled_upload
from services.registry.validation import check_adapter_name, check_base_name, check_name

MULTIPART_SLACK = 1 << 20  # form boundaries and fields on top of the adapter's own bytes


# --- request and response bodies -----------------------------------------------------------------
# Names are checked by the registry (422 `bad_name` naming the rule); the pattern is documented here
# so that generated clients and fuzzers know it, not enforced twice.
NAME_PATTERN = r"^[a-z0-9][a-z0-9-]{0,62}$"
NAME_DOC = {"pattern": NAME_PATTERN, "description": "1-63 lowercase letters, digits and '-'"}


def name_field() -> Any:
    return Field(json_schema_extra=NAME_DOC)


class TenantCreate(BaseModel):
    name: str = name_field()


class TenantCreated(BaseModel):
    tenant: str
    api_key: str = Field(description="shown once; only its hash is stored")
    key_id: str


class BaseModelCreate(BaseModel):
    name: str
    config: dict = Field(description="the model's Hugging Face config.json")
    source: str = Field("", max_length=2000)


class AliasCreate(BaseModel):
    name: str = name_field()
    adapter: str = name_field()


class OverrideRequest(BaseModel):
    actor: str = Field(min_length=1, max_length=200, description="who overrides the evaluation gate")
    reason: str = Field(min_length=1, max_length=2000)


class EvaluateRequest(BaseModel):
    requested_by: str = Field("admin", min_length=1, max_length=200)


class ApiKeyPublic(BaseModel):
    key_id: str
    kind: str = Field("inference", description="inference (API key) or nats (a NATS credential)")
    created_at: datetime
    revoked_at: datetime | None = None
    last_used_at: datetime | None = Field(None, description="a NATS credential's last connection")


KEY_ID_PATTERN = r"^[0-9a-f]{16}$"
# Errors a route documents beyond every admin route's 400/401/422/503.
LOOKUP = documented(404)  # names something that may not exist
CHANGES = documented(404, 409)  # ... and changes state that may not allow it
PUSH_RESPONSES = {200: {"description": "already registered (idempotent)"}, **documented(404, 409, 413)}
Name = Annotated[
    str,
    Path(pattern=NAME_PATTERN, description="1-63 lowercase letters, digits and '-', starting with a letter or digit"),
]
VersionNumber = Annotated[int, Path(ge=1, le=PG_INT_MAX, description="version number (1, 2, ...)")]


class TenantUpdate(BaseModel):
    eval_threshold: float | None = Field(
        None, ge=0, le=1, description="pass rate a new version needs (null: the eval gate's default)"
    )


class MigrationCreate(BaseModel):
    from_base: str
    to_base: str
    steps: int = Field(30, ge=1, le=100_000, description="training steps per adapter")
    batch_size: int = Field(4, ge=1, le=1024)
    seed: int = Field(0, ge=0, le=2**32 - 1)
    requested_by: str = Field("admin", min_length=1, max_length=200)


class ItemFailure(BaseModel):
    reason: str = Field(min_length=1, max_length=2000)


class RetireRequest(BaseModel):
    reason: str = Field("", max_length=2000)


class RollbackRequest(BaseModel):
    to_version: int | None = Field(None, ge=1, le=PG_INT_MAX)


class PushReply(BaseModel):
    created: bool
    version: VersionPublic


class Resolution(BaseModel):
    tenant: str
    alias: str
    adapter: str
    version: int
    ref: AdapterRef


# --- plumbing ----------------------------------------------------------------------------------
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


# --- health -----------------------------------------------------------------------------------
health = APIRouter(tags=["health"])


@health.get("/healthz")
async def healthz() -> dict:
    return {"status": "ok"}


class Readiness(BaseModel):
    ready: bool
    checks: dict[str, str] = Field(description="each dependency (database, nats, ...): ok or why not")


@health.get("/readyz", response_model=Readiness, responses={503: {"model": Readiness, "description": "not ready"}})
async def readyz(request: Request) -> JSONResponse:
    ok, checks = await request.app.state.service.ready()
    return JSONResponse(status_code=200 if ok else 503, content={"ready": ok, "checks": checks})


# --- tenants and base models (admin) -------------------------------------------------------------
admin = APIRouter(prefix="/v1", dependencies=[Depends(require_admin)], responses=documented(400, 401, 422, 503))


@admin.post("/tenants", status_code=201, tags=["tenants"], responses=documented(409))
async def create_tenant(body: TenantCreate, ctx: Ctx) -> TenantCreated:
    async with transaction(ctx.sessions) as session:
        tenant, key = await tenants.create_tenant(session, body.name)
    return TenantCreated(tenant=tenant.name, api_key=key.plaintext, key_id=key.key_id)


@admin.get("/tenants", tags=["tenants"])
async def list_tenants(ctx: Ctx) -> list[TenantPublic]:
    async with ctx.sessions() as session:
        return [TenantPublic.model_validate(t, from_attributes=True) for t in await tenants.list_tenants(session)]


@admin.patch("/tenants/{tenant}", tags=["tenants"], responses=LOOKUP)
async def update_tenant(tenant: Name, body: TenantUpdate, ctx: Ctx) -> TenantPublic:
    async with transaction(ctx.sessions) as session:
        row = await aliases.get_tenant(session, check_name("tenant", tenant))
        row.eval_threshold = body.eval_threshold
        session.add(row)
        await session.flush()
        return TenantPublic.model_validate(row, from_attributes=True)


@admin.put("/tenants/{tenant}/limits", tags=["tenants"], responses=LOOKUP)
async def set_limits(tenant: Name, body: TenantLimits, ctx: Ctx) -> TenantPublic:
    """Replace the tenant's limits (a field left out or null: the pool default). Every gateway picks
    the change up from the registry's event."""
    async with transaction(ctx.sessions) as session:
        row = await aliases.get_tenant(session, check_name("tenant", tenant))
        await tenants.set_limits(session, row, body)
        public = TenantPublic.model_validate(row, from_attributes=True)
    ctx.wake_relay()
    return public


@admin.get("/tenants/{tenant}/keys", tags=["tenants"], responses=LOOKUP)
async def list_keys(tenant: Name, ctx: Ctx) -> list[ApiKeyPublic]:
    async with ctx.sessions() as session:
        row = await aliases.get_tenant(session, check_name("tenant", tenant))
        return [ApiKeyPublic.model_validate(k, from_attributes=True) for k in await tenants.list_keys(session, row)]


@admin.post("/tenants/{tenant}/keys/{key_id}/revoke", tags=["tenants"], responses=CHANGES)
async def revoke_key(tenant: Name, key_id: Annotated[str, Path(pattern=KEY_ID_PATTERN)], ctx: Ctx) -> ApiKeyPublic:
    """Revoke a key or NATS credential (idempotent). A key stops working at every gateway within about
    a second; a NATS credential's open connections are disconnected and it cannot connect again."""
    async with transaction(ctx.sessions) as session:
        row = await aliases.get_tenant(session, check_name("tenant", tenant))
        key = await tenants.revoke_key(session, row, key_id)
        public = ApiKeyPublic.model_validate(key, from_attributes=True)
    ctx.wake_relay()
    if public.kind == "nats" and ctx.nats_access is not None:
        await ctx.nats_access.disconnect(tenant, key_id)
    return public


class UsageRowPublic(BaseModel):
    adapter: str = Field(description="name-vN, or the base model's name")
    hour: datetime
    requests: int
    prompt_tokens: int
    completion_tokens: int
    errors: int


class CostPublic(BaseModel):
    """An estimate: each input says whether it is measured, configured or assumed."""

    usd: float = Field(description="estimated cost of the completion tokens in the period")
    usd_per_million_tokens: float = Field(description="(GPU $/h) / (output tok/s per GPU x 3600) x 1e6")
    gpu_price_per_hour: float
    gpu_price_source: str
    tok_s_per_gpu: float
    tok_s_source: str


class UsagePublic(BaseModel):
    tenant: str
    since: datetime
    rows: list[UsageRowPublic]
    totals: dict[str, int]
    cost: CostPublic


@admin.get("/tenants/{tenant}/usage", tags=["usage"], responses=LOOKUP)
async def tenant_usage(
    tenant: Name, ctx: Ctx, since_hours: Annotated[float, Query(gt=0, le=24 * 400)] = 24.0
) -> UsagePublic:
    """Requests, prompt and completion tokens and errors per adapter and hour (UTC), each request
    counted once, from the hour `since_hours` ago on."""
    async with ctx.sessions() as session:
        row = await aliases.get_tenant(session, check_name("tenant", tenant))
        found = await usage.summary(session, row, usage.since_of(since_hours))
    rows = [UsageRowPublic(**vars(r)) for r in found.rows]
    totals = found.totals()
    basis = cost_basis(ctx.settings)
    cost = CostPublic(
        usd=round(basis.usd(totals["completion_tokens"]), 6),
        usd_per_million_tokens=round(basis.usd_per_million_tokens, 6),
        gpu_price_per_hour=basis.gpu_price_per_hour,
        gpu_price_source=basis.gpu_price_source,
        tok_s_per_gpu=basis.tok_s_per_gpu,
        tok_s_source=basis.tok_s_source,
    )
    return UsagePublic(tenant=found.tenant, since=found.since, rows=rows, totals=totals, cost=cost)


@admin.post("/tenants/{tenant}/keys", status_code=201, tags=["tenants"], responses=LOOKUP)
async def add_key(tenant: Name, ctx: Ctx) -> TenantCreated:
    async with transaction(ctx.sessions) as session:
        row = await aliases.get_tenant(session, check_name("tenant", tenant))
        key = await tenants.add_key(session, row)
    return TenantCreated(tenant=tenant, api_key=key.plaintext, key_id=key.key_id)


class NatsCredentialCreated(BaseModel):
    tenant: str
    key_id: str
    nats_user: str = Field(description="the user name the tenant's NATS connection uses")
    credential: str = Field(description="its password; shown once, only its hash is stored")
    nats_url: str


@admin.post("/tenants/{tenant}/nats-credentials", status_code=201, tags=["tenants"], responses=LOOKUP)
async def add_nats_credential(tenant: Name, ctx: Ctx) -> NatsCredentialCreated:
    """A NATS credential for the tenant's async client: it may submit the tenant's work and read its
    own results, nothing else (the broker enforces it). Revoke it like a key."""
    async with transaction(ctx.sessions) as session:
        row = await aliases.get_tenant(session, check_name("tenant", tenant))
        key = await tenants.add_key(session, row, keys.NATS)
    url = ctx.settings.nats_public_url or ctx.settings.connections.nats_url
    return NatsCredentialCreated(
        tenant=tenant, key_id=key.key_id, nats_user=f"tenant:{tenant}", credential=key.plaintext, nats_url=url
    )


@admin.post("/base-models", status_code=201, tags=["base models"], responses=documented(409))
async def register_base(body: BaseModelCreate, ctx: Ctx) -> BaseModelPublic:
    try:
        spec = BaseModelSpec.from_hf_config(body.config, name=check_base_name(body.name))
    except (KeyError, TypeError, ValueError) as exc:
        raise Invalid(f"config is not a usable Hugging Face config.json: missing or bad {exc}") from None
    if body.source:
        spec = BaseModelSpec(**{**spec.__dict__, "source": body.source})
    async with transaction(ctx.sessions) as session:
        row = await bases.register_base(session, spec)
    return BaseModelPublic.model_validate(row, from_attributes=True)


@admin.get("/base-models", tags=["base models"])
async def list_bases(ctx: Ctx) -> list[BaseModelPublic]:
    async with ctx.sessions() as session:
        return [BaseModelPublic.model_validate(r, from_attributes=True) for r in await bases.list_bases(session)]


# --- adapters and versions (admin) ---------------------------------------------------------------
@admin.post("/adapters", tags=["adapters"], responses=PUSH_RESPONSES)
async def push(
    ctx: Ctx,
    tenant: Annotated[str, Form(json_schema_extra=NAME_DOC)],
    adapter: Annotated[str, Form(json_schema_extra=NAME_DOC)],
    base_model: Annotated[str, Form()],
    files: Annotated[list[UploadFile], File()],
    dataset: Annotated[str | None, Form()] = None,
    migration_item: Annotated[int | None, Form(ge=1, le=PG_INT_MAX)] = None,
) -> JSONResponse:
    """Push a version: multipart with `tenant`, `adapter`, `base_model` and the adapter's files
    (adapter_config.json and adapter_model.safetensors), optionally `dataset` (the tenant's dataset
    it was trained from: the eval gate evaluates on its eval split). 201 when created, 200 when this
    adapter already has exactly this content."""
    check_name("tenant", tenant)
    check_adapter_name(adapter)
    with spooled_upload(files, ctx.settings.max_adapter_bytes) as directory:
        result = await versions.push_version(
            ctx,
            tenant=tenant,
            adapter=adapter,
            base_model=base_model,
            directory=directory,
            dataset=dataset or None,
            migration_item=migration_item,
        )
    body = PushReply(created=result.created, version=result.version)
    return JSONResponse(status_code=201 if result.created else 200, content=body.model_dump(mode="json"))


@admin.get("/adapters", tags=["adapters"], responses=LOOKUP)
async def list_adapters(ctx: Ctx, tenant: str | None = Query(None)) -> list:
    async with ctx.sessions() as session:
        return [a.model_dump(mode="json") for a in await versions.list_adapters(session, tenant)]


@admin.get("/tenants/{tenant}/adapters/{adapter}/versions", tags=["adapters"], responses=LOOKUP)
async def history(tenant: Name, adapter: Name, ctx: Ctx) -> list[VersionPublic]:
    async with ctx.sessions() as session:
        return await versions.history(session, tenant, adapter)


@admin.post("/tenants/{tenant}/adapters/{adapter}/rollback", tags=["lifecycle"], responses=CHANGES)
async def rollback(tenant: Name, adapter: Name, body: RollbackRequest, ctx: Ctx) -> VersionPublic:
    async with transaction(ctx.sessions) as session:
        number = await aliases.rollback(session, await aliases.get_tenant(session, tenant), adapter, body.to_version)
    ctx.wake_relay()
    async with ctx.sessions() as session:
        return await versions.show_alias(session, tenant, aliases.pinned_name(adapter, number))


async def _transition(ctx: RegistryContext, tenant: str, adapter: str, number: int, apply) -> VersionPublic:
    async with transaction(ctx.sessions) as session:
        alias = await aliases.find_alias(
            session, await aliases.get_tenant(session, tenant), aliases.pinned_name(adapter, number)
        )
        vctx = await lifecycle.load_version(session, alias.version_id)
        await apply(session, vctx)
    ctx.wake_relay()
    return await versions.show_version(ctx, alias.version_id)


@admin.post("/tenants/{tenant}/adapters/{adapter}/versions/{number}/evaluating", tags=["lifecycle"], responses=CHANGES)
async def begin_evaluation(tenant: Name, adapter: Name, number: VersionNumber, ctx: Ctx) -> VersionPublic:
    """The eval gate announces that it started on this version (optional: a verdict implies it)."""
    return await _transition(ctx, tenant, adapter, number, lifecycle.begin_evaluation)


@admin.post("/tenants/{tenant}/adapters/{adapter}/versions/{number}/evaluate", tags=["lifecycle"], responses=CHANGES)
async def request_evaluation(
    tenant: Name, adapter: Name, number: VersionNumber, body: EvaluateRequest, ctx: Ctx
) -> VersionPublic:
    """Ask the eval gate to (re-)evaluate a pending, evaluating or rejected version."""

    async def apply(session, vctx):
        await lifecycle.request_evaluation(session, vctx, body.requested_by)

    return await _transition(ctx, tenant, adapter, number, apply)


@admin.post("/tenants/{tenant}/adapters/{adapter}/versions/{number}/activate", tags=["lifecycle"], responses=CHANGES)
async def override_activate(
    tenant: Name, adapter: Name, number: VersionNumber, body: OverrideRequest, ctx: Ctx
) -> VersionPublic:
    """Admin override: activate without a passing evaluation. Recorded (actor, reason, time) in the
    version and in the "activated" event."""
    override = lifecycle.Override(actor=body.actor, reason=body.reason)

    async def apply(session, vctx):
        await lifecycle.activate(session, vctx, override=override)

    return await _transition(ctx, tenant, adapter, number, apply)


@admin.post("/tenants/{tenant}/adapters/{adapter}/versions/{number}/retire", tags=["lifecycle"], responses=CHANGES)
async def retire(tenant: Name, adapter: Name, number: VersionNumber, body: RetireRequest, ctx: Ctx) -> VersionPublic:
    async def apply(session, vctx):
        await lifecycle.retire(session, vctx, body.reason)

    return await _transition(ctx, tenant, adapter, number, apply)


# --- aliases (admin) -----------------------------------------------------------------------------
@admin.get("/tenants/{tenant}/aliases", tags=["aliases"], responses=LOOKUP)
async def list_aliases(tenant: Name, ctx: Ctx) -> list[AliasPublic]:
    async with ctx.sessions() as session:
        return await aliases.list_aliases(session, await aliases.get_tenant(session, tenant))


@admin.post("/tenants/{tenant}/aliases", status_code=201, tags=["aliases"], responses=CHANGES)
async def create_alias(tenant: Name, body: AliasCreate, ctx: Ctx) -> AliasPublic:
    async with transaction(ctx.sessions) as session:
        row = await aliases.get_tenant(session, tenant)
        await aliases.add_follow(session, row, await aliases.get_adapter(session, row, body.adapter), body.name)
    ctx.wake_relay()
    async with ctx.sessions() as session:
        found = [a for a in await aliases.list_aliases(session, row) if a.name == body.name]
    return found[0]


@admin.get("/tenants/{tenant}/aliases/{alias}", tags=["aliases"], responses=LOOKUP)
async def show_alias(tenant: Name, alias: Name, ctx: Ctx) -> VersionPublic:
    """The version an alias points at now, whatever its status."""
    async with ctx.sessions() as session:
        return await versions.show_alias(session, tenant, alias)


# --- datasets (admin) ----------------------------------------------------------------------------
@admin.post("/datasets", status_code=201, tags=["datasets"], responses=documented(404, 409, 413))
async def upload_dataset(
    ctx: Ctx,
    tenant: Annotated[str, Form(json_schema_extra=NAME_DOC)],
    name: Annotated[str, Form(json_schema_extra=NAME_DOC)],
    file: Annotated[UploadFile, File()],
) -> datasets.DatasetPublic:
    with spooled_upload([file], ctx.settings.max_adapter_bytes) as directory:
        return await datasets.store_dataset(ctx, tenant, name, directory / (file.filename or ""))


@admin.get("/tenants/{tenant}/datasets", tags=["datasets"], responses=LOOKUP)
async def list_datasets(tenant: Name, ctx: Ctx) -> list[datasets.DatasetPublic]:
    async with ctx.sessions() as session:
        return await datasets.list_datasets(session, tenant)


# --- base-model migrations (admin) ---------------------------------------------------------------
@admin.get("/migrations/plan", tags=["migrations"], responses=LOOKUP)
async def migration_plan(
    ctx: Ctx, from_base: str = Query(...), to_base: str = Query(...)
) -> base_migrations.MigrationPlan:
    """Every adapter served on `from_base` and the dataset it would be retrained from."""
    async with ctx.sessions() as session:
        return await base_migrations.plan(session, from_base, to_base)


@admin.post("/migrations", status_code=201, tags=["migrations"], responses=CHANGES)
async def start_migration(body: MigrationCreate, ctx: Ctx) -> base_migrations.MigrationStatus:
    """Start a migration: one training job per adapter, through the outbox (exactly once)."""
    recipe = base_migrations.default_recipe(ctx.settings.max_rank, body.steps, body.seed, body.batch_size)
    async with transaction(ctx.sessions) as session:
        migration = await base_migrations.start(
            session, from_base=body.from_base, to_base=body.to_base, recipe=recipe, requested_by=body.requested_by
        )
    ctx.wake_relay()
    async with ctx.sessions() as session:
        return await base_migrations.status(session, migration.id)


@admin.get("/migrations", tags=["migrations"])
async def list_migrations(ctx: Ctx) -> list[base_migrations.MigrationStatus]:
    async with ctx.sessions() as session:
        return await base_migrations.list_migrations(session)


@admin.get("/migrations/{migration_id}", tags=["migrations"], responses=LOOKUP)
async def migration_status(migration_id: str, ctx: Ctx) -> base_migrations.MigrationStatus:
    async with ctx.sessions() as session:
        return await base_migrations.status(session, migration_id)


@admin.post("/migrations/{migration_id}/items/{item_id}/failed", tags=["migrations"], responses=CHANGES)
async def migration_item_failed(
    migration_id: str, item_id: Annotated[int, Path(ge=1, le=PG_INT_MAX)], body: ItemFailure, ctx: Ctx
) -> dict:
    """The trainer reports that an item's training failed (the tenant stays on the old base)."""
    async with transaction(ctx.sessions) as session:
        await base_migrations.fail_item(session, migration_id, item_id, body.reason)
    return {"ok": True}


@admin.post("/admin/sweep-orphans", tags=["maintenance"])
async def sweep(ctx: Ctx, grace_s: float | None = Query(None, ge=0, le=10 * 365 * 24 * 3600)) -> dict:
    return {"swept": await orphans.sweep_orphans(ctx, grace_s)}


# --- resolution (admin token or the tenant's API key) ------------------------------------------
public = APIRouter(prefix="/v1", tags=["resolve"], responses=documented(400, 401, 404, 422, 503))


@public.get("/resolve/{tenant}/{alias}")
async def resolve(
    tenant: Name, alias: Name, ctx: Ctx, authorization: Annotated[str | None, Header()] = None
) -> Resolution:
    """(tenant, alias) -> the active version's digest, object key, base model and rank."""
    async with ctx.sessions() as session:
        if not is_admin(ctx, authorization):
            await tenants.authenticate(session, tenant, bearer(authorization) or "")
        found = await aliases.resolve(session, tenant, alias)
    return Resolution(
        tenant=found.tenant, alias=found.alias, adapter=found.adapter, version=found.version, ref=found.ref
    )


# --- the app -------------------------------------------------------------------------------------
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
    for router in (health, admin, public):
        app.include_router(router)
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
