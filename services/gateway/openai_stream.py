"""Streamed answers (`stream: true`): server-sent events, one `data: {chunk}` per piece of text, then
the finish reason, the usage chunk when asked for, and `data: [DONE]`; an error after the stream
started comes as one last `data: {error}` event (the status line was sent already)."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator

from pydantic import BaseModel

from libs.contracts import InferenceResult
from services.gateway.errors import GatewayError
from services.gateway.limits import Ticket
from services.gateway.openai_replies import Reply, record, record_timeline


def _data(doc: BaseModel | dict) -> str:
    if isinstance(doc, BaseModel):  # pydantic's own serializer: about half the cost per token of json.dumps
        body = doc.model_dump_json(exclude_unset=True)  # a chunk leaves out what OpenAI leaves out (schemas.py)
    else:
        body = json.dumps(doc, separators=(",", ":"))
    return f"data: {body}\n\n"


async def sse(
    gw,
    job,
    deadline: float,
    reply: Reply,
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
            yield _data(reply.chunk("", None, first=True))
            first = False
        async for event in gw.dispatcher.events(job, deadline):
            if isinstance(event, InferenceResult):
                final = event
                yield _data(reply.chunk(None, event.finish_reason or "stop"))
                if include_usage:
                    yield _data(reply.usage_chunk(event))
                break
            if not got_text:
                gw.metrics.ttft_s.record(time.perf_counter() - started, attrs)
                got_text = True
            lps = reply.logprobs(event.logprobs, streamed)
            if first or lps is not None:
                yield _data(reply.chunk(event.text, None, first=first, lps=lps))
            else:  # the common chunk, one per token: from a template, not three pydantic models
                yield reply.text_event(event.text)
            streamed += len(event.text)
            first = False
        yield "data: [DONE]\n\n"
        if final is not None:
            record_timeline(gw, job, final, accepted_at)
    except GatewayError as exc:
        status = exc.status
        yield _data(exc.body())
    finally:
        record(gw, attrs, status, started)
        if ticket is not None:
            gw.limiter.release(ticket, final.prompt_tokens + final.completion_tokens if final else None)
