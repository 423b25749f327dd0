"""The OpenAI response bodies of one answer, built from the documented models of `schemas.py` (what
the OpenAPI shows is what is sent), and what an answered request records (metrics, stage timeline)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from functools import cached_property

from pydantic_core import to_json

from libs.contracts import InferenceResult, TokenLogprob
from services.gateway import logprobs, timeline
from services.gateway.schemas import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatDelta,
    ChatLogprobs,
    Completion,
    CompletionChoice,
    CompletionChunk,
    CompletionLogprobs,
    Model,
    ModelList,
    Usage,
)

log = logging.getLogger(__name__)


def usage(result: InferenceResult) -> Usage:
    return Usage(
        prompt_tokens=result.prompt_tokens,
        completion_tokens=result.completion_tokens,
        total_tokens=result.prompt_tokens + result.completion_tokens,
    )


@dataclass(frozen=True)
class Reply:
    """What every body or chunk of one answer repeats."""

    kind: str  # chat | completion
    rid: str
    model: str
    alternatives: int | None  # logprobs asked for with this many alternatives; None: no logprobs
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def id(self) -> str:
        return f"chatcmpl-{self.rid}" if self.kind == "chat" else f"cmpl-{self.rid}"

    def logprobs(
        self, tokens: list[TokenLogprob] | None, text_offset: int = 0
    ) -> ChatLogprobs | CompletionLogprobs | None:
        if self.alternatives is None or tokens is None:
            return None
        if self.kind == "chat":
            return ChatLogprobs.model_validate(logprobs.chat(tokens, self.alternatives))
        return CompletionLogprobs.model_validate(logprobs.completion(tokens, self.alternatives, text_offset))

    def body(self, result: InferenceResult) -> ChatCompletion | Completion:
        """The whole answer (not streamed)."""
        finish, lps = result.finish_reason or "stop", self.logprobs(result.logprobs)
        common = dict(
            id=self.id,
            created=self.created,
            model=self.model,
            usage=usage(result),
            system_fingerprint=result.adapter_digest_applied,
        )
        if self.kind == "chat":
            message = AssistantMessage(role="assistant", content=result.text)
            choice = ChatChoice(index=0, message=message, logprobs=lps, finish_reason=finish)
            return ChatCompletion(object="chat.completion", choices=[choice], **common)
        choice = CompletionChoice(index=0, text=result.text, logprobs=lps, finish_reason=finish)
        return Completion(object="text_completion", choices=[choice], **common)

    def chunk(
        self, text: str | None, finish: str | None, first: bool = False, lps=None
    ) -> ChatCompletionChunk | CompletionChunk:
        """One streamed chunk: text (the role too in a chat's first), or the finish reason. Sent with
        exclude_unset (schemas.py): every field OpenAI sends, null or not, is set here explicitly."""
        common = dict(id=self.id, created=self.created, model=self.model)
        if self.kind == "chat":
            delta = ChatDelta(
                **({"role": "assistant"} if first else {}), **({"content": text} if text is not None else {})
            )
            choice = ChatChunkChoice(index=0, delta=delta, logprobs=lps, finish_reason=finish)
            return ChatCompletionChunk(object="chat.completion.chunk", choices=[choice], **common)
        choice = CompletionChoice(index=0, text=text or "", logprobs=lps, finish_reason=finish)
        return CompletionChunk(object="text_completion", choices=[choice], **common)

    def text_event(self, text: str) -> str:
        """The server-sent event of a chunk that carries only text (no role, logprobs or finish reason):
        byte for byte `data: {self.chunk(text, None).model_dump_json(exclude_unset=True)}` (a unit test
        holds them equal), from a template rendered once per answer. Every token of every streamed answer
        is one; building three pydantic models per token was the gateway's largest cost per token."""
        head, tail = self._text_template
        return f"data: {head}{to_json(text).decode()}{tail}\n\n"

    @cached_property
    def _text_template(self) -> tuple[str, str]:
        marker = "\u2063lpx-text\u2063"
        rendered = self.chunk(marker, None).model_dump_json(exclude_unset=True)
        head, _, tail = rendered.rpartition(to_json(marker).decode())  # the last: the text follows id and model
        return head, tail

    def usage_chunk(self, result: InferenceResult) -> ChatCompletionChunk | CompletionChunk:
        """OpenAI's stream_options.include_usage: one last chunk with no choices."""
        common = dict(id=self.id, created=self.created, model=self.model, choices=[], usage=usage(result))
        if self.kind == "chat":
            return ChatCompletionChunk(object="chat.completion.chunk", **common)
        return CompletionChunk(object="text_completion", **common)


def model_list(names: list[str], bases: set[str], tenant: str) -> ModelList:
    models = [Model(id=n, object="model", created=0, owned_by="loraplex" if n in bases else tenant) for n in names]
    return ModelList(object="list", data=models)


def record(gw, attrs: dict, status: int, started: float) -> None:
    gw.metrics.requests.add(1, {**attrs, "status": status})
    gw.metrics.latency_s.record(time.perf_counter() - started, attrs)


def record_timeline(gw, job, result: InferenceResult, accepted_at: float) -> None:
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
