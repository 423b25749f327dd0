"""The mixed load of a chaos drill and how its outcome is judged.

Sync: chat completions over HTTP through the gateway, for tenant A's adapter (pirate tone), tenant
B's adapter (formal tone) and the base model; some drills also stream some of them (`stream: true`:
the text joined from the server-sent events is judged, so a token lost on the way shows). Async:
the same mix submitted over NATS with libs.client (durable submission stream), results read back
from the results stream.

Per request the verdict is one of: correct (200 / ok result, and the text is the asked adapter's:
the pirate answer says "Ahoy", the formal one "Dear", the base model says neither), wrong_adapter,
an error code (503, 504, ...), or lost (an async submission with no result). "Answered twice" counts
request ids with more than one result stored in the results stream.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field

import httpx

from libs.client import LoraplexClient, tenant_of
from libs.contracts import InferenceResult, subjects

MARKERS = {"support": "Ahoy", "concierge": "Dear"}


@dataclass
class DrillReport:
    drill: str
    sync_sent: int = 0
    async_sent: int = 0
    correct: int = 0
    wrong_adapter: int = 0
    lost: int = 0
    answered_twice: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    seconds_to_serve_again: float | None = None
    slowest_sync_s: float = 0.0
    notes: str = ""

    @property
    def sent(self) -> int:
        return self.sync_sent + self.async_sent


def verdict(model: str, text: str) -> str:
    if model.startswith("cold-"):
        return "correct"  # random adapters: what they say is noise; the gateway checked the applied digest
    marker = MARKERS.get(model)
    if marker is not None:
        return "correct" if marker in text else "wrong_adapter"
    return "wrong_adapter" if any(m in text for m in MARKERS.values()) else "correct"


@dataclass
class Load:
    """One drill's requests, sent all at once; `finish` waits for every answer and fills the report."""

    platform: object
    report: DrillReport
    sync_count: int = 9
    async_count: int = 6
    max_tokens: int = 16
    streamed_count: int = 0
    _sync: list = field(default_factory=list)
    _streamed: list = field(default_factory=list)
    _async: list = field(default_factory=list)
    _sync_ids: list = field(default_factory=list)

    def _who(self, i: int) -> tuple[str, str]:
        p = self.platform
        return [("support", p.key_a), ("concierge", p.key_b), ("smollm2-135m", p.key_a)][i % 3]

    async def start(self, client: LoraplexClient) -> None:
        http = httpx.AsyncClient(base_url=self.platform.gateway.url, timeout=200)
        self._http = http
        for i in range(self.sync_count):
            model, key = self._who(i)
            self._sync.append((model, asyncio.create_task(self._ask(http, model, key, i))))
        for i in range(self.streamed_count):
            model, key = self._who(i)
            self._streamed.append((model, asyncio.create_task(self._ask_streamed(http, model, key, i))))
        for i in range(self.async_count):
            model, key = self._who(i)
            rid = f"chaos-{uuid.uuid4().hex[:12]}"
            question = [{"role": "user", "content": f"Async question {i}: where is my order?"}]
            await client.submit(model, api_key=key, request_id=rid, max_tokens=self.max_tokens, messages=question)
            self._async.append((model, rid, tenant_of(key)))
        self.report.sync_sent += self.sync_count + self.streamed_count
        self.report.async_sent += self.async_count

    def add_sync(self, model: str, key: str, i: int) -> None:
        """One more sync request, sent now (the load must have started)."""
        self._sync.append((model, asyncio.create_task(self._ask(self._http, model, key, i))))
        self.report.sync_sent += 1

    async def _ask(self, http: httpx.AsyncClient, model: str, key: str, i: int):
        started = time.monotonic()
        body = {
            "model": model,
            "max_tokens": self.max_tokens,
            "messages": [{"role": "user", "content": f"Question {i}: where is my order?"}],
        }
        try:
            reply = await http.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})
        except httpx.HTTPError as exc:
            return None, type(exc).__name__, time.monotonic() - started
        return reply, None, time.monotonic() - started

    async def _ask_streamed(self, http: httpx.AsyncClient, model: str, key: str, i: int):
        """A streamed request: (the outcome, None, seconds) or (None, what failed, seconds)."""
        started = time.monotonic()
        body = {
            "model": model,
            "max_tokens": self.max_tokens,
            "stream": True,
            "messages": [{"role": "user", "content": f"Streamed question {i}: where is my order?"}],
        }
        try:
            async with http.stream(
                "POST", "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
            ) as reply:
                outcome = Streamed(reply.status_code, reply.headers.get("x-request-id"))
                if reply.status_code != 200:
                    outcome.error = _error_code(httpx.Response(reply.status_code, content=await reply.aread()))
                else:
                    await outcome.read(reply)
        except httpx.HTTPError as exc:
            return None, type(exc).__name__, time.monotonic() - started
        return outcome, None, time.monotonic() - started

    async def finish(self, client: LoraplexClient, async_timeout_s: float = 180.0) -> DrillReport:
        r = self.report
        errors: Counter = Counter(r.errors)
        for model, task in self._sync:
            reply, failure, took = await task
            r.slowest_sync_s = max(r.slowest_sync_s, round(took, 2))
            if reply is None:
                errors[f"http:{failure}"] += 1
            elif reply.status_code != 200:
                errors[f"{reply.status_code} {_error_code(reply)}".strip()] += 1
            else:
                self._sync_ids.append(reply.headers["x-request-id"])
                self._judge(model, reply.json()["choices"][0]["message"]["content"], errors)
        for model, task in self._streamed:
            outcome, failure, took = await task
            r.slowest_sync_s = max(r.slowest_sync_s, round(took, 2))
            if outcome is None:
                errors[f"stream:{failure}"] += 1
            elif outcome.error is not None or not outcome.done:
                errors[f"stream:{outcome.status} {outcome.error or 'no [DONE]'}".strip()] += 1
            elif outcome.request_id is None or await _stored_text(client, outcome.request_id) != outcome.text:
                errors["stream: text differs from the stored result"] += 1  # a piece lost or doubled
            else:
                self._sync_ids.append(outcome.request_id)
                self._judge(model, outcome.text, errors)
        await self._http.aclose()
        results = await asyncio.gather(*(self._result(client, rid, async_timeout_s) for _, rid, _ in self._async))
        for (model, _, _), result in zip(self._async, results, strict=True):
            if result is None:
                r.lost += 1
            elif not result.ok:
                errors[f"async:{result.error.code}"] += 1
            else:
                self._judge(model, result.text, errors)
        r.errors = dict(errors)
        stored = [subjects.tenant_results(tenant, rid) for _, rid, tenant in self._async]
        stored += [
            subjects.result_lookup(internal, "any")
            for _, rid, tenant in self._async
            for internal in (f"sub-{tenant}-{rid}",)
        ]
        stored += [subjects.result_lookup(rid, "any") for rid in self._sync_ids]
        r.answered_twice += await self._twice(client, stored)
        return r

    def _judge(self, model: str, text: str, errors: Counter) -> None:
        if verdict(model, text) == "correct":
            self.report.correct += 1
        else:
            self.report.wrong_adapter += 1

    @staticmethod
    async def _result(client: LoraplexClient, rid: str, timeout_s: float):
        try:
            return await client.result(rid, timeout=timeout_s)
        except TimeoutError:
            return None

    @staticmethod
    async def _twice(client: LoraplexClient, filters: list[str]) -> int:
        """Result subjects (filters: a gateway's prefix is a wildcard) stored more than once: an async
        submission's public and internal results and each sync answer must each be stored once."""
        twice = 0
        for subject_filter in filters:
            info = await client.js.stream_info(subjects.RESULTS_STREAM, subjects_filter=subject_filter)
            twice += sum(count > 1 for count in (info.state.subjects or {}).values())
        return twice


@dataclass
class Streamed:
    """What a streamed request got: the text joined from its chunks, whether `[DONE]` came, and the
    error event's code when one ended the stream."""

    status: int
    request_id: str | None
    text: str = ""
    done: bool = False
    error: str | None = None

    async def read(self, reply: httpx.Response) -> None:
        pieces = []
        async for line in reply.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line.removeprefix("data: ")
            if data == "[DONE]":
                self.done = True
                break
            event = json.loads(data)
            if "error" in event:
                self.error = (event["error"] or {}).get("code") or "error"
                continue
            for choice in event.get("choices") or ():
                pieces.append((choice.get("delta") or {}).get("content") or "")
        self.text = "".join(pieces)


async def _stored_text(client: LoraplexClient, request_id: str) -> str | None:
    """The text of the result the worker stored for a sync request (the whole answer, as generated)."""
    stored = await client.js.get_last_msg(subjects.RESULTS_STREAM, subjects.result_lookup(request_id, "any"))
    return InferenceResult.model_validate_json(stored.data).text


def _error_code(reply: httpx.Response) -> str:
    try:
        return reply.json()["error"]["code"] or ""
    except (ValueError, KeyError, TypeError):
        return ""


async def seconds_until_serving(platform, since: float, timeout_s: float = 120.0) -> float | None:
    """From `since` (time.monotonic()) until a fresh request through the gateway is answered 200."""
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(base_url=platform.gateway.url, timeout=30) as http:
        while time.monotonic() < deadline:
            body = {"model": "smollm2-135m", "max_tokens": 1, "messages": [{"role": "user", "content": "ping"}]}
            try:
                reply = await http.post(
                    "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {platform.key_a}"}
                )
                if reply.status_code == 200:
                    return round(time.monotonic() - since, 2)
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.25)
    return None


def render_table(reports: list[DrillReport]) -> str:
    cols = (
        "drill",
        "sent",
        "correct",
        "wrong adapter",
        "lost",
        "answered twice",
        "errors",
        "serves again (s)",
        "slowest sync (s)",
    )
    rows = [
        (
            r.drill,
            r.sent,
            r.correct,
            r.wrong_adapter,
            r.lost,
            r.answered_twice,
            ", ".join(f"{k}: {v}" for k, v in sorted(r.errors.items())) or "-",
            "-" if r.seconds_to_serve_again is None else r.seconds_to_serve_again,
            r.slowest_sync_s,
        )
        for r in reports
    ]
    widths = [max(len(str(c)), *(len(str(row[i])) for row in rows)) for i, c in enumerate(cols)]
    line = " | ".join(str(c).ljust(w) for c, w in zip(cols, widths, strict=True))
    sep = "-+-".join("-" * w for w in widths)
    body = [" | ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join([line, sep, *body])
