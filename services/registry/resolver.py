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

from libs.contracts import ResolveReply, ResolveRequest, subjects
from services.registry import aliases, tenants
from services.registry.context import RegistryContext
from services.registry.db import is_unavailable
from services.registry.deadletters import DeadLetters
from services.registry.errors import RegistryError

log = logging.getLogger(__name__)
QUEUE_GROUP = "lpx-registry-resolve"


async def resolve_request(ctx: RegistryContext, request: ResolveRequest) -> ResolveReply:
    """The reply for one well-formed request; never raises."""
    try:
        async with ctx.sessions() as session:
            if request.api_key is not None:
                await tenants.authenticate(session, request.tenant, request.api_key)
            resolved = await aliases.resolve(session, request.tenant, request.alias)
    except RegistryError as exc:
        return ResolveReply(found=False, error=exc.message, code=_reply_code(exc))
    except Exception as exc:  # noqa: BLE001 - the caller gets a clear refusal, never a hang
        if not is_unavailable(exc):
            log.exception("resolve failed for %s/%s", request.tenant, request.alias)
        return ResolveReply(found=False, error=f"registry unavailable: {type(exc).__name__}", code="unavailable")
    return ResolveReply(found=True, adapter=resolved.ref, version=resolved.version)


def _reply_code(exc: RegistryError) -> str:
    # Unknown tenant, alias or adapter all read "not_found" to the gateway: the distinction is in `error`.
    return "not_found" if exc.code.startswith("unknown_") or exc.code == "not_found" else exc.code


def register(broker, ctx: RegistryContext, dead_letters: DeadLetters) -> None:

    @broker.subscriber(subjects.RESOLVE, queue=QUEUE_GROUP)
    async def on_resolve(msg: NatsMessage) -> ResolveReply:
        try:
            request = ResolveRequest.model_validate_json(msg.body)
        except ValidationError as exc:
            reason = f"malformed ResolveRequest: {_first_error(exc)}"
            await dead_letters.send(subjects.RESOLVE, reason, msg.body, msg.headers)
            return ResolveReply(found=False, error=reason, code="bad_request")
        return await resolve_request(ctx, request)


def _first_error(exc: ValidationError) -> str:
    errors = exc.errors()
    if not errors:
        return str(exc)
    first = errors[0]
    where = ".".join(str(p) for p in first.get("loc", ())) or "body"
    return f"{where}: {first.get('msg', 'invalid')}"
