"""What the gateway's OpenAPI documents: OpenAI's response bodies and error shape, and every status a
route can answer, so that generated clients (and the openai client) know what comes back."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class ErrorDetail(BaseModel):
    message: str
    type: str = Field(description="invalid_request_error, authentication_error, rate_limit_error, ...")
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """OpenAI's error shape."""

    error: ErrorDetail


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(description="the `top_logprobs` most likely tokens at this place")


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = Field(None, description="with `logprobs: true`")
    finish_reason: str | None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str | None = Field(description="the digest of the adapter that answered (null: base model)")


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None] = Field(description="`logprobs` + 1 alternatives per token")
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = Field(None, description="with `logprobs: k`")
    finish_reason: str | None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage
    system_fingerprint: str | None


# --- streamed chunks (server-sent events, `data: {chunk}`) ----------------------------------------
# A chunk is sent with `model_dump(exclude_unset=True)`: a key OpenAI leaves out (the delta's role after
# the first chunk, `usage` before the last) is not set, one it sends as null is set to None.
class ChatDelta(BaseModel):
    """What one chunk adds to the message: the role in the first, then text."""

    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChatChunkChoice] = Field(description="empty in the usage chunk")
    usage: Usage | None = Field(None, description="only in the last chunk, with `stream_options.include_usage`")


class CompletionChunk(BaseModel):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice] = Field(description="empty in the usage chunk")
    usage: Usage | None = Field(None, description="only in the last chunk, with `stream_options.include_usage`")


class Model(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[Model]


_ERRORS = {
    400: "invalid request: the parameter is named in `param`",
    401: "no, a malformed or a revoked API key",
    404: "no such model for this tenant (or no active version yet)",
    413: "the request body is over the gateway's limit (LPX_GATEWAY_MAX_BODY_BYTES)",
    429: "over the tenant's limits: Retry-After says when to retry",
    502: "the worker failed or answered with another adapter than resolved (the answer is withheld)",
    503: "no worker can take it now, the pool is overloaded (Retry-After), or the registry is unreachable",
    504: "not finished within the deadline",
}


def error_responses(*statuses: int) -> dict[int | str, dict]:
    return {status: {"model": ErrorResponse, "description": _ERRORS[status]} for status in statuses}


# One server-sent event: `data` is a JSON chunk (chat.completion.chunk / text_completion) or "[DONE]".
SSE_EVENT = {
    "type": "object",
    "properties": {"data": {"type": "string"}, "event": {"type": "string"}, "id": {"type": "string"}},
    "required": ["data"],
}


def completion_responses(model: type[BaseModel]) -> dict[int | str, dict]:
    """200 as JSON or, with `stream`, server-sent events; and every error a completion can end in."""
    ok = {
        "model": model,
        "description": "the answer; with `stream: true` server-sent events (`data: {chunk}` lines, then "
        "`data: [DONE]`)",
        "content": {"text/event-stream": {"schema": SSE_EVENT}},
    }
    return {200: ok, **error_responses(400, 401, 404, 413, 429, 502, 503, 504)}


MODELS_RESPONSES = {200: {"model": ModelList}, **error_responses(400, 401, 503)}
