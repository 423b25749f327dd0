"""Alias resolution over NATS request/reply (subjects.RESOLVE), for the gateway.

Request: ResolveRequest(tenant, alias, api_key=None). Reply: ResolveReply(found, adapter=AdapterRef,
version, error, code). Only active versions resolve. With `api_key`, the key must be a live key of
`tenant`. A malformed request gets an error reply (when it has a reply subject) and a dead letter;
the responder keeps serving. Replicas share the subject through a queue group.
"""

from __future__ import annotations

import logging

from faststream.nats.annotations import NatsMessage
from pydantic import ValidationError

from libs.contracts import ResolveReply, ResolveRequest, TenantAuthReply, TenantAuthRequest, subjects
from libs.contracts.parsing import first_error
from services.registry import aliases, keys, tenants
from services.registry.context import RegistryContext
from services.registry.db import is_unavailable
from services.registry.deadletters import DeadLetters
from services.registry.deadlines import answer_in_time
from services.registry.errors import RegistryError

log = logging.getLogger(__name__)
QUEUE_GROUP = "lpx-registry-resolve"


async def resolve_request(ctx: RegistryContext, request: ResolveRequest) -> ResolveReply:
    """The reply for one well-formed request; never raises."""
    try:
        async with ctx.sessions() as session:
            limits = None
            if request.api_key is not None:
                limits = tenants.limits_of(await tenants.authenticate(session, request.tenant, request.api_key))
            resolved = await aliases.resolve(session, request.tenant, request.alias)
    except RegistryError as exc:
        return ResolveReply(found=False, error=exc.message, code=_reply_code(exc))
    except Exception as exc:
        if not is_unavailable(exc):
            log.exception("resolve failed for %s/%s", request.tenant, request.alias)
        return ResolveReply(found=False, error=f"registry unavailable: {type(exc).__name__}", code="unavailable")
    return ResolveReply(found=True, adapter=resolved.ref, version=resolved.version, limits=limits)


async def auth_request(ctx: RegistryContext, request: TenantAuthRequest) -> TenantAuthReply:
    """Authenticate a key alone (base-model requests, /v1/models); never raises. On success the reply
    lists the tenant's aliases that serve an active version now."""
    parsed = keys.parse(request.api_key)
    if parsed is None:
        return TenantAuthReply(ok=False, code="unauthorized", error="invalid API key")
    try:
        async with ctx.sessions() as session:
            tenant = await tenants.authenticate(session, parsed.tenant, request.api_key)
            names = [
                a.name
                for a in await aliases.list_aliases(session, tenant)
                if a.version is not None and await _servable(session, tenant.name, a.name)
            ]
    except RegistryError as exc:
        return TenantAuthReply(ok=False, error=exc.message, code=_reply_code(exc))
    except Exception as exc:
        if not is_unavailable(exc):
            log.exception("auth failed for tenant %s", parsed.tenant)
        return TenantAuthReply(ok=False, error=f"registry unavailable: {type(exc).__name__}", code="unavailable")
    return TenantAuthReply(ok=True, tenant=tenant.name, aliases=names, limits=tenants.limits_of(tenant))


async def _servable(session, tenant: str, alias: str) -> bool:
    try:
        await aliases.resolve(session, tenant, alias)
        return True
    except RegistryError:
        return False


def _reply_code(exc: RegistryError) -> str:
    # Unknown tenant, alias or adapter all read "not_found" to the gateway: the distinction is in `error`.
    return "not_found" if exc.code.startswith("unknown_") or exc.code == "not_found" else exc.code


def register(broker, ctx: RegistryContext, dead_letters: DeadLetters) -> None:

    @broker.subscriber(subjects.RESOLVE, queue=QUEUE_GROUP)
    async def on_resolve(msg: NatsMessage) -> ResolveReply:
        try:
            request = ResolveRequest.model_validate_json(msg.body)
        except ValidationError as exc:
            reason = f"malformed ResolveRequest: {first_error(exc)}"
            await dead_letters.send(subjects.RESOLVE, reason, msg.body, msg.headers)
            return ResolveReply(found=False, error=reason, code="bad_request")
        return await answer_in_time(
            ctx.expired, subjects.RESOLVE, msg.headers, resolve_request(ctx, request), link=ctx.link
        )

    @broker.subscriber(subjects.AUTH, queue=QUEUE_GROUP)
    async def on_auth(msg: NatsMessage) -> TenantAuthReply:
        try:
            request = TenantAuthRequest.model_validate_json(msg.body)
        except ValidationError as exc:
            reason = f"malformed TenantAuthRequest: {first_error(exc)}"
            await dead_letters.send(subjects.AUTH, reason, msg.body, msg.headers)
            return TenantAuthReply(ok=False, error=reason, code="bad_request")
        return await answer_in_time(ctx.expired, subjects.AUTH, msg.headers, auth_request(ctx, request), link=ctx.link)
