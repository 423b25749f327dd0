"""The OpenAI-compatible HTTP API: /v1/chat/completions, /v1/completions (SSE or not), /v1/models.

`Authorization: Bearer <tenant API key>`; `model` is an alias of the caller's tenant (`support`,
`support-v4`) or a base model name. Errors come in OpenAI's shape with the matching status.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from opentelemetry import trace
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from libs.contracts import (
    MAX_LOGPROBS,
    ChatMessage,
    InferenceResult,
    SamplingParams,
    StructuredOutput,
    TokenLogprob,
    new_id,
)
from libs.telemetry import extract_context
from services.gateway import errors, logprobs, timeline
from services.gateway.auth import bearer_key
from services.gateway.errors import GatewayError
from services.gateway.limits import Ticket, estimate_tokens
from services.gateway.schemas import MODELS_RESPONSES, ChatCompletion, Completion, completion_responses

log = logging.getLogger(__name__)

router = APIRouter()
MAX_NEW_TOKENS = SamplingParams.model_fields["max_tokens"].metadata[-1].le
MAX_STOP = SamplingParams.model_fields["stop"].metadata[-1].max_length
MAX_SEED = 2**63 - 1
_bearer = HTTPBearer(auto_error=False, description="your tenant's API key: `Authorization: Bearer lpx_...`")


def _authorization(credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> str | None:
    """The Authorization header as sent (the key's format is checked later: 401 in OpenAI's shape)."""
    return f"{credentials.scheme} {credentials.credentials}" if credentials else None


Authorization = Annotated[str | None, Depends(_authorization)]


# --- request bodies (the subset of OpenAI's parameters a LoRA worker honours) -------------------
MAX_TEXT = 1_000_000  # characters of one field; the prompt as a whole is bounded by max_prompt_chars
MAX_PARTS = 1_000  # messages, content parts
Text = Annotated[str, Field(max_length=MAX_TEXT)]
StopText = Annotated[str, Field(max_length=1_000)]


# Honour or refuse, never ignore: a parameter OpenAI documents that loraplex does not implement is
# accepted only at its "off" value and refused with 400 naming it otherwise; an unknown one is refused.
UNSUPPORTED = {
    "tools",
    "tool_choice",
    "functions",
    "function_call",
    "frequency_penalty",
    "presence_penalty",
    "logit_bias",
    "modalities",
    "audio",
    "prediction",
    "reasoning_effort",
    "web_search_options",
    "best_of",
    "echo",
    "suffix",
}
NOT_SUPPORTED = "not supported by this server (refused with 400, never ignored)"
Off = Annotated[None, Field(description=NOT_SUPPORTED)]
Zero = Annotated[float | None, Field(None, ge=0, le=0, description=f"0 only; {NOT_SUPPORTED}")]
Empty = Annotated[dict | list | None, Field(None, max_length=0, description=f"empty only; {NOT_SUPPORTED}")]


class _ContentPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: str = Field(max_length=MAX_TEXT)


class ChatMessageIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant", "developer"]
    content: Text | Annotated[list[_ContentPart], Field(max_length=MAX_PARTS)]
    name: str | None = Field(None, max_length=256, description="accepted, not used")

    def to_contract(self) -> ChatMessage:
        text = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        return ChatMessage(role="system" if self.role == "developer" else self.role, content=text)


class TextFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]


class JsonObjectFormat(BaseModel):
    """Any JSON object: decoding is constrained by vLLM's structured outputs, not asked for politely."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["json_object"]


class JsonSchemaSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = Field(None, max_length=MAX_TEXT)
    schema_: dict | None = Field(
        None,
        alias="schema",
        description="a JSON Schema (draft 2020-12; an invalid one is refused with 400); absent: any JSON object",
    )
    strict: bool | None = Field(None, description="accepted; decoding always follows the schema")


class JsonSchemaFormat(BaseModel):
    """JSON valid against `json_schema.schema`: decoding is constrained to it (vLLM structured outputs)."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


ResponseFormat = Annotated[TextFormat | JsonObjectFormat | JsonSchemaFormat, Field(discriminator="type")]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str = Field(min_length=1, max_length=256, description="an adapter alias of your tenant or a base model")
    max_tokens: int | None = Field(None, ge=1, le=MAX_NEW_TOKENS)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    stop: StopText | Annotated[list[StopText], Field(max_length=MAX_STOP)] | None = None
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int | None = Field(None, ge=1, le=1, description="only 1 is supported")
    user: str | None = Field(None, max_length=256, description="accepted for OpenAI compatibility, not used")
    metadata: dict[str, Annotated[str, Field(max_length=512)]] | None = Field(None, max_length=16)
    store: bool | None = Field(None, description="accepted, nothing is stored")
    service_tier: str | None = Field(None, max_length=32, description="accepted, not used")
    frequency_penalty: Zero = None
    presence_penalty: Zero = None
    logit_bias: Empty = None

    def alternatives(self) -> int | None:
        """How many alternatives per generated token the caller wants with logprobs; None: no logprobs."""
        return None

    def structured(self) -> StructuredOutput | None:
        return None

    def sampling(self, default_max_tokens: int) -> SamplingParams:
        if self.n not in (None, 1):
            raise errors.bad_request("only n=1 is supported", "n")
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        max_tokens = self.max_tokens or default_max_tokens
        alternatives = self.alternatives()
        if alternatives is not None and (why := logprobs.check_budget(max_tokens, alternatives)):
            raise errors.bad_request(why, "max_tokens")
        values = {
            "max_tokens": max_tokens,
            "stop": stop,
            "seed": self.seed,
            "logprobs": alternatives,
            "structured": self.structured(),
        }
        if self.temperature is not None:
            values["temperature"] = self.temperature
        if self.top_p is not None:
            values["top_p"] = self.top_p
        try:
            return SamplingParams(**values)
        except ValidationError as exc:
            first = exc.errors()[0]
            param = ".".join(str(p) for p in first.get("loc", ())) or None
            raise errors.bad_request(f"invalid {param}: {first.get('msg')}", param) from None


class ChatCompletionRequest(_Common):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"model": "smollm2-135m", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 16},
                {
                    "model": "smollm2-135m",
                    "messages": [{"role": "user", "content": "Hi"}],
                    "stream": True,
                    "stream_options": {"include_usage": True},
                },
            ]
        },
    )
    messages: list[ChatMessageIn] = Field(min_length=1, max_length=MAX_PARTS)
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_NEW_TOKENS)
    logprobs: bool | None = Field(None, description="log-probabilities of the generated tokens")
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS, description="alternatives per token (needs logprobs)")
    response_format: ResponseFormat | None = Field(
        None, description="text (default), json_object or json_schema: structured outputs with the adapter applied"
    )
    tools: Empty = None
    tool_choice: Literal["none"] | None = Field(None, description=f'"none" only; {NOT_SUPPORTED}')
    parallel_tool_calls: bool | None = Field(None, description="accepted (no tools are called)")
    functions: Empty = None
    function_call: Literal["none"] | None = Field(None, description=f'"none" only; {NOT_SUPPORTED}')
    modalities: list[Literal["text"]] | None = Field(None, max_length=1, description="text only")
    audio: Off = None
    prediction: Off = None
    reasoning_effort: Off = None
    web_search_options: Off = None

    def alternatives(self) -> int | None:
        if self.top_logprobs and not self.logprobs:
            raise errors.bad_request("top_logprobs needs logprobs to be true", "top_logprobs")
        return (self.top_logprobs or 0) if self.logprobs else None

    def structured(self) -> StructuredOutput | None:
        fmt = self.response_format
        if fmt is None or fmt.type == "text":
            return None
        if fmt.type == "json_object" or fmt.json_schema.schema_ is None:
            return StructuredOutput(kind="json_object")
        try:
            return StructuredOutput(kind="json_schema", json_schema=fmt.json_schema.schema_)
        except ValidationError as exc:
            reason = str(exc.errors()[0].get("ctx", {}).get("error") or exc.errors()[0].get("msg"))
            raise errors.bad_request(f"response_format.json_schema.schema: {reason}", "response_format") from None


class CompletionRequest(_Common):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"model": "smollm2-135m", "prompt": "The capital of France is", "max_tokens": 8},
            ]
        },
    )
    prompt: Text | Annotated[list[Text], Field(min_length=1, max_length=1)] = Field(
        description="one prompt (a list of exactly one is accepted)"
    )
    echo: Literal[False] = Field(False, description=f"false only; {NOT_SUPPORTED}")
    suffix: Literal[""] | None = Field(None, description=f"empty only; {NOT_SUPPORTED}")
    logprobs: int | None = Field(
        None,
        ge=0,
        le=MAX_LOGPROBS,
        description="log-probabilities with this many alternatives per token (+1, as OpenAI counts)",
    )
    best_of: Literal[1] | None = Field(None, description=f"1 only; {NOT_SUPPORTED}")

    def alternatives(self) -> int | None:
        return self.logprobs


def describe_invalid(error: dict) -> tuple[str, str | None]:
    """(message, param) of a request validation error, in OpenAI's words where it has them."""
    loc = [str(p) for p in error.get("loc", ()) if p != "body"]
    param = loc[0] if loc else None
    if error.get("type") == "extra_forbidden":
        return f"Unrecognized request argument supplied: {'.'.join(loc)}", param
    if param in UNSUPPORTED and len(loc) <= 2:
        return f"{param} is {NOT_SUPPORTED}: {error.get('msg', 'invalid')}", param
    return f"invalid request: {'.'.join(loc) or 'body'}: {error.get('msg', 'invalid')}", param


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
    data = [{"id": n, "object": "model", "created": 0, "owned_by": "loraplex" if n in bases else tenant} for n in names]
    return JSONResponse({"object": "list", "data": data})


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
                )
                if body.stream:
                    usage = bool(body.stream_options and body.stream_options.include_usage)
                    gen = _sse(
                        gw,
                        job,
                        deadline,
                        _Reply(kind, rid, body.model, sampling.logprobs),
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
            _record(gw, attrs, exc.status, started)
            span.set_attribute("http.response.status_code", exc.status)
            raise
        _record(gw, attrs, 200, started)
        _record_timeline(gw, job, result, accepted_at)
        span.set_attribute("lpx.worker", result.worker_id)
        return JSONResponse(
            _completion_body(_Reply(kind, rid, body.model, sampling.logprobs), result),
            headers={"X-Request-Id": rid, "X-Lpx-Worker": result.worker_id},
        )


def _record(gw, attrs: dict, status: int, started: float) -> None:
    gw.metrics.requests.add(1, {**attrs, "status": status})
    gw.metrics.latency_s.record(time.perf_counter() - started, attrs)


def _record_timeline(gw, job, result: InferenceResult, accepted_at: float) -> None:
    spans = timeline.stages(
        accepted_at=accepted_at,
        publish_started_at=job.publish_started_at,
        published_at=job.published_at,
        result=result,
        received_at=job.received_at,
        replied_at=time.time(),
    )
    for stage, seconds in spans.items():
        gw.metrics.stage_s.record(seconds, {"stage": stage})
    if log.isEnabledFor(logging.DEBUG):  # per request (metrics aggregate): where one tenant's time went
        log.debug("timeline", extra={"request_id": job.request.request_id, "tenant": job.request.tenant_id, **spans})


def _usage(result: InferenceResult) -> dict:
    return {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens,
        "total_tokens": result.prompt_tokens + result.completion_tokens,
    }


@dataclass(frozen=True)
class _Reply:
    """What every body or chunk of one answer repeats."""

    kind: str  # chat | completion
    rid: str
    model: str
    alternatives: int | None  # logprobs asked for with this many alternatives; None: no logprobs
    created: int = field(default_factory=lambda: int(time.time()))

    def logprobs(self, tokens: list[TokenLogprob] | None, text_offset: int = 0) -> dict | None:
        if self.alternatives is None or tokens is None:
            return None
        if self.kind == "chat":
            return logprobs.chat(tokens, self.alternatives)
        return logprobs.completion(tokens, self.alternatives, text_offset)


def _completion_body(reply: _Reply, result: InferenceResult) -> dict:
    finish, rid, model, created = result.finish_reason or "stop", reply.rid, reply.model, reply.created
    lps = reply.logprobs(result.logprobs)
    if reply.kind == "chat":
        return {
            "id": f"chatcmpl-{rid}",
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": result.text},
                    "logprobs": lps,
                    "finish_reason": finish,
                }
            ],
            "usage": _usage(result),
            "system_fingerprint": result.adapter_digest_applied,
        }
    return {
        "id": f"cmpl-{rid}",
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "text": result.text, "logprobs": lps, "finish_reason": finish}],
        "usage": _usage(result),
        "system_fingerprint": result.adapter_digest_applied,
    }


def _chunk(reply: _Reply, text: str | None, finish: str | None, first: bool = False, lps: dict | None = None) -> dict:
    rid, model, created = reply.rid, reply.model, reply.created
    if reply.kind == "chat":
        delta: dict = {}
        if first:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        return {
            "id": f"chatcmpl-{rid}",
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "logprobs": lps, "finish_reason": finish}],
        }
    return {
        "id": f"cmpl-{rid}",
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "text": text or "", "logprobs": lps, "finish_reason": finish}],
    }


def _data(doc: dict) -> str:
    return f"data: {json.dumps(doc, separators=(',', ':'))}\n\n"


async def _sse(
    gw,
    job,
    deadline: float,
    reply: _Reply,
    clocks: tuple[float, float],
    attrs: dict,
    include_usage: bool = False,
    ticket: Ticket | None = None,
) -> AsyncIterator[str]:
    started, accepted_at = clocks
    first, got_text, final, streamed = True, False, None, 0
    status = 200
    try:
        if reply.kind == "chat":
            yield _data(_chunk(reply, "", None, first=True))
            first = False
        async for event in gw.dispatcher.events(job, deadline):
            if isinstance(event, InferenceResult):
                final = event
                yield _data(_chunk(reply, None, event.finish_reason or "stop"))
                if include_usage:  # OpenAI's stream_options.include_usage: one last chunk with no choices
                    last = _chunk(reply, None, None)
                    last["choices"], last["usage"] = [], _usage(event)
                    yield _data(last)
                break
            if not got_text:
                gw.metrics.ttft_s.record(time.perf_counter() - started, attrs)
                got_text = True
            yield _data(_chunk(reply, event.text, None, first=first, lps=reply.logprobs(event.logprobs, streamed)))
            streamed += len(event.text)
            first = False
        yield "data: [DONE]\n\n"
        if final is not None:
            _record_timeline(gw, job, final, accepted_at)
    except GatewayError as exc:
        status = exc.status
        yield _data(exc.body())
    finally:
        _record(gw, attrs, status, started)
        if ticket is not None:
            gw.limiter.release(ticket, final.prompt_tokens + final.completion_tokens if final else None)
