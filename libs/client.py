"""A small Python client for async submission over NATS (batch and event-driven callers).

    async with LoraplexClient(nats_url, api_key=key, nats_credential=creds) as client:
        rid = await client.submit("support", messages=[{"role": "user", "content": "Hi"}])
        result = await client.result(rid, timeout=60)          # an InferenceResult (ok or error)
        async for event in client.stream(rid): ...              # str deltas, then the InferenceResult

`submit` publishes a SubmitRequest to the durable submission stream with Nats-Msg-Id = request id, so
resubmitting the same id (retries after a timeout, at-least-once producers) never generates twice.
Results are read from the RESULTS stream, where they are kept for its retention (24 h by default).

The broker requires a credential. A tenant's NATS credential (`lpx tenant nats-creds TENANT`) lets
this client publish the tenant's submissions on `lpx.submit.<tenant>` and read its own results and
token deltas, nothing else: every subject it uses is scoped to the tenant its keys name. Services
and operator tools may pass `user`/`password` of a service account instead.
For streaming, call `stream()` before the request starts generating: `submit(..., stream=True)` and
then `stream(rid)` right away, or give your own `request_id` and start `stream()` first.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator, Sequence

import nats
from nats.js.errors import NotFoundError

from libs.bus.link import quiet_callbacks
from libs.bus.retry import TRANSIENT as _TRANSIENT
from libs.bus.retry import publish_retrying
from libs.contracts import (
    ChatMessage,
    InferenceResult,
    SamplingParams,
    StructuredOutput,
    SubmitRequest,
    TokenDelta,
    new_id,
    subjects,
)
from libs.settings import nats_servers

# Both kinds of tenant secret name their tenant: lpx_<tenant>_... (API key), lpxn_<tenant>_... (NATS).
_TENANT_OF_SECRET = re.compile(r"lpxn?_(?P<tenant>[a-z0-9][a-z0-9-]{0,62})_[0-9a-f]{16}_[0-9a-f]{64}")


def tenant_of(secret: str | None) -> str | None:
    """The tenant an API key or NATS credential belongs to (None for anything else)."""
    match = _TENANT_OF_SECRET.fullmatch(secret or "")
    return match["tenant"] if match else None


class LoraplexClient:
    def __init__(
        self,
        nats_url: str,
        api_key: str | None = None,
        *,
        nats_credential: str | None = None,
        tenant: str | None = None,
        user: str | None = None,
        password: str | None = None,
        nc=None,
    ) -> None:
        self.nats_url = nats_url
        self.api_key = api_key
        self.nats_credential = nats_credential
        self.tenant = tenant or tenant_of(nats_credential) or tenant_of(api_key)
        if nats_credential and tenant_of(nats_credential) != self.tenant:
            raise ValueError(f"the NATS credential is not tenant {self.tenant!r}'s")
        self.user, self.password = user, password
        self._nc = nc
        self._own = nc is None
        self._tenant_of_request: dict[str, str] = {}  # submitted with a per-call key of another tenant

    def _auth(self) -> dict:
        """Connection options: a tenant's credential (user = tenant, its own inbox prefix, which its
        permissions allow), or a service account's user and password."""
        if self.nats_credential:
            return dict(
                user=f"tenant:{self.tenant}",
                password=self.nats_credential,
                inbox_prefix=subjects.tenant_inbox_prefix(self.tenant).encode(),
            )
        if self.user:
            return dict(user=self.user, password=self.password)
        return {}

    async def connect(self) -> LoraplexClient:
        if self._nc is None:
            self._nc = await nats.connect(
                servers=nats_servers(self.nats_url),  # every node of a cluster
                name="lpx-client",
                max_reconnect_attempts=-1,
                reconnect_time_wait=0.5,
                **self._auth(),
                **quiet_callbacks("NATS (lpx client)"),
            )
        self._js = self._nc.jetstream()
        return self

    def _tenant(self, request_id: str | None = None) -> str:
        if request_id in self._tenant_of_request:
            return self._tenant_of_request[request_id]
        if not self.tenant:
            raise ValueError("the tenant is not known: pass an API key or NATS credential (they name it) or tenant=")
        return self.tenant

    async def close(self) -> None:
        if self._nc is not None and self._own:
            with contextlib.suppress(Exception):
                await self._nc.drain()
        self._nc = None

    async def __aenter__(self) -> LoraplexClient:
        return await self.connect()

    async def __aexit__(self, *exc) -> None:
        await self.close()

    @property
    def nc(self):
        """The NATS connection (e.g. to subscribe to many results at once)."""
        if self._nc is None:
            raise RuntimeError("LoraplexClient is not connected: use `async with` or `await client.connect()`")
        return self._nc

    @property
    def js(self):
        if self._nc is None:
            raise RuntimeError("LoraplexClient is not connected: use `async with` or `await client.connect()`")
        return self._js

    async def submit(
        self,
        model: str,
        *,
        messages: Sequence[dict | ChatMessage] | None = None,
        prompt: str | None = None,
        max_tokens: int = 128,
        temperature: float = 0.0,
        top_p: float = 1.0,
        stop: Sequence[str] = (),
        seed: int | None = None,
        stream: bool = False,
        timeout_s: float | None = None,
        request_id: str | None = None,
        api_key: str | None = None,
        publish_retry_s: float = 30.0,
        tier: str = "batch",
        logprobs: int | None = None,
        json_schema: dict | bool | None = None,
    ) -> str:
        """Queue one request; returns its request id as soon as JetStream has stored it. While the broker
        is away (restart, leader election) the publish is retried for `publish_retry_s` with the same
        Nats-Msg-Id, so it is stored once however many tries it takes. `tier`: batch (fills the capacity
        interactive traffic leaves) or interactive (admitted ahead of batch work in a full pool).
        `logprobs`: the result carries each token's logprob with this many alternatives. `json_schema`:
        the answer is JSON valid against this schema (True: any JSON object), decoding constrained by vLLM;
        a schema that is not JSON Schema raises ValueError here."""
        key = api_key or self.api_key
        if not key:
            raise ValueError("an API key is required (LoraplexClient(api_key=...) or submit(api_key=...))")
        # A tenant's credential publishes on its own subject only; a service account (operator tools,
        # tests) submits for whichever tenant the key names.
        tenant = (self.tenant if self.nats_credential else tenant_of(key)) or self._tenant()
        request = SubmitRequest(
            request_id=request_id or new_id(),
            api_key=key,
            model=model,
            prompt=prompt,
            messages=[m if isinstance(m, ChatMessage) else ChatMessage(**m) for m in messages] if messages else None,
            sampling=SamplingParams(
                max_tokens=max_tokens,
                temperature=temperature,
                top_p=top_p,
                stop=list(stop),
                seed=seed,
                logprobs=logprobs,
                structured=_structured(json_schema),
            ),
            stream=stream,
            timeout_s=timeout_s,
            tier=tier,
        )
        await publish_retrying(
            self.js,
            subjects.submit(tenant),
            request.model_dump_json().encode(),
            headers={"Nats-Msg-Id": f"{tenant}-{request.request_id}"},
            stream=subjects.SUBMIT_STREAM,
            give_up_at=time.time() + publish_retry_s,
        )
        if tenant != self.tenant:
            self._tenant_of_request[request.request_id] = tenant
        return request.request_id

    async def stored_result(self, request_id: str) -> InferenceResult | None:
        """The stored result, read by a direct get scoped to this tenant's result subjects."""
        subject = subjects.tenant_results(self._tenant(request_id), request_id)
        try:
            msg = await self.js.get_last_msg(subjects.RESULTS_STREAM, subject, direct=True)
        except NotFoundError:
            return None
        return InferenceResult.model_validate_json(msg.data)

    async def result(self, request_id: str, timeout: float = 120.0) -> InferenceResult:
        """The final result (ok or an error result); TimeoutError if none arrives in `timeout` seconds."""
        arrived: asyncio.Queue[bytes] = asyncio.Queue()

        async def on_result(msg) -> None:
            arrived.put_nowait(msg.data)

        sub = await self._nc.subscribe(subjects.tenant_results(self._tenant(request_id), request_id), cb=on_result)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            while True:
                # The stream is asked again every few seconds: a result published while this client
                # was cut off from the broker never reaches the subscription.
                with contextlib.suppress(NotFoundError, *_TRANSIENT):
                    stored = await self.stored_result(request_id)
                    if stored is not None:
                        return stored
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise TimeoutError(f"no result for {request_id} within {timeout:.0f}s")
                with contextlib.suppress(TimeoutError):
                    data = await asyncio.wait_for(arrived.get(), min(remaining, 3.0))
                    return InferenceResult.model_validate_json(data)
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def stream(self, request_id: str, timeout: float = 120.0) -> AsyncIterator[str | InferenceResult]:
        """Text deltas (str) as they are generated, then the final InferenceResult. Deltas missed before
        subscribing are not replayed; the final result always carries the whole text."""
        events: asyncio.Queue[tuple[str, bytes]] = asyncio.Queue()

        async def on_token(msg) -> None:
            events.put_nowait(("token", msg.data))

        async def on_result(msg) -> None:
            events.put_nowait(("result", msg.data))

        tenant = self._tenant(request_id)
        subs = [
            await self._nc.subscribe(subjects.tenant_tokens(tenant, request_id), cb=on_token),
            await self._nc.subscribe(subjects.tenant_results(tenant, request_id), cb=on_result),
        ]
        try:
            stored = await self.stored_result(request_id)
            if stored is not None:
                yield stored
                return
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            while True:
                kind, data = await asyncio.wait_for(events.get(), max(0.0, deadline - loop.time()))
                if kind == "token":
                    yield TokenDelta.model_validate_json(data).text
                else:
                    yield InferenceResult.model_validate_json(data)
                    return
        finally:
            for sub in subs:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()


def _structured(json_schema: dict | bool | None) -> StructuredOutput | None:
    if json_schema is None or json_schema is False:
        return None
    if json_schema is True:
        return StructuredOutput(kind="json_object")
    return StructuredOutput(kind="json_schema", json_schema=json_schema)
