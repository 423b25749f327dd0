"""The OpenAI-compatible HTTP API: /v1/chat/completions, /v1/completions (SSE or not), /v1/models.

`Authorization: Bearer <tenant API key>`; `model` is an alias of the caller's tenant (`support`,
`support-v4`) or a base model name. Errors come in OpenAI's shape with the matching status.
"""

from __future__ import annotations

import logging
import time
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from opentelemetry import trace

from libs.contracts import ChatMessage, new_id
from libs.telemetry import extract_context
from services.gateway.auth import bearer_key
from services.gateway.errors import GatewayError
from services.gateway.limits import estimate_tokens
from services.gateway.openai_replies import Reply, model_list, record, record_timeline
from services.gateway.openai_requests import ChatCompletionRequest, CompletionRequest, _Common
from services.gateway.openai_stream import sse
from services.gateway.schemas import MODELS_RESPONSES, ChatCompletion, Completion, completion_responses

log = logging.getLogger(__name__)

router = APIRouter()
_bearer = HTTPBearer(auto_error=False, description="your tenant's API key: `Authorization: Bearer lpx_...`")


async def _authorization(
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> str | None:
    """The Authorization header as sent (the key's format is checked later: 401 in OpenAI's shape).
    Async on purpose: FastAPI runs a plain `def` dependency in its thread pool, a thread hand-off and
    back on every request for a string join."""
    return f"{credentials.scheme} {credentials.credentials}" if credentials else None


Authorization = Annotated[str | None, Depends(_authorization)]


# --- handlers ------------------------------------------------------------------------------------
@router.post("/v1/chat/completions", response_model=None, responses=completion_responses(ChatCompletion))
async def chat_completions(body: ChatCompletionRequest, request: Request, authorization: Authorization):
    if body.max_completion_tokens and not body.max_tokens:
        body.max_tokens = body.max_completion_tokens
    messages = [m.to_contract() for m in body.messages]
    return await _serve(request, authorization, body, "chat", prompt=None, messages=messages)


@router.post("/v1/completions", response_model=None, responses=completion_responses(Completion))
async def completions(body: CompletionRequest, request: Request, authorization: Authorization):
    if isinstance(body.prompt, list):  # exactly one (the schema refuses more)
        body.prompt = body.prompt[0]
    return await _serve(request, authorization, body, "completion", prompt=body.prompt, messages=None)


@router.get("/v1/models", response_model=None, responses=MODELS_RESPONSES)
async def list_models(request: Request, authorization: Authorization) -> JSONResponse:
    gw = request.app.state.gateway
    key, _ = bearer_key(authorization)
    tenant, names = await gw.models(key)
    bases = gw.base_models()
    return JSONResponse(model_list(names, bases, tenant).model_dump())


async def _serve(
    request: Request,
    authorization: str | None,
    body: _Common,
    kind: str,
    *,
    prompt: str | None,
    messages: list[ChatMessage] | None,
):
    gw = request.app.state.gateway
    started, accepted_at = time.perf_counter(), time.time()
    endpoint = "chat.completions" if kind == "chat" else "completions"
    attrs = {"endpoint": endpoint, "tenant": "unknown"}
    with gw.tracer.start_as_current_span(
        f"POST /v1/{endpoint.replace('.', '/')}",
        kind=trace.SpanKind.SERVER,
        context=extract_context(dict(request.headers)),
    ) as span:
        try:
            # Bad input is answered first, like the schema's own checks that run before any handler.
            sampling = body.sampling(default_max_tokens=128 if kind == "chat" else 16)
            key, tenant = bearer_key(authorization)
            attrs["tenant"] = tenant
            span.set_attribute("lpx.tenant", tenant)
            span.set_attribute("lpx.model", body.model)
            prepared = await gw.prepare(key, body.model)
            prompt_chars = gw.check_prompt(prompt, messages)
            ticket = gw.limiter.admit(tenant, prepared.limits, estimate_tokens(prompt_chars, sampling.max_tokens))
            rid = new_id()
            span.set_attribute("lpx.request_id", rid)
            deadline = time.time() + gw.settings.request_timeout_s
            streaming = False
            try:
                job = await gw.dispatch(
                    prepared,
                    request_id=rid,
                    prompt=prompt,
                    messages=messages,
                    sampling=sampling,
                    deadline=deadline,
                    stream=body.stream,
                    fresh=True,  # rid minted just above
                )
                if body.stream:
                    usage = bool(body.stream_options and body.stream_options.include_usage)
                    gen = sse(
                        gw,
                        job,
                        deadline,
                        Reply(kind, rid, body.model, sampling.logprobs),
                        (started, accepted_at),
                        attrs,
                        usage,
                        ticket,
                    )
                    streaming = True  # the stream releases the ticket when it ends
                    return StreamingResponse(
                        gen, media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Request-Id": rid}
                    )
                result = await gw.dispatcher.wait(job, deadline)
                gw.limiter.release(ticket, result.prompt_tokens + result.completion_tokens)
            finally:
                if not streaming:
                    gw.limiter.release(ticket)  # a no-op after the release above; on failure the estimate stays
        except GatewayError as exc:
            record(gw, attrs, exc.status, started)
            span.set_attribute("http.response.status_code", exc.status)
            raise
        record(gw, attrs, 200, started)
        record_timeline(gw, job, result, accepted_at)
        span.set_attribute("lpx.worker", result.worker_id)
        return JSONResponse(
            Reply(kind, rid, body.model, sampling.logprobs).body(result).model_dump(),
            headers={"X-Request-Id": rid, "X-Lpx-Worker": result.worker_id},
        )
