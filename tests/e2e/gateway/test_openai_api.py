"""The official openai client against the real gateway (registry, NATS, a real worker on vLLM): chat,
completions, streaming, models; and the refusals: 401 bad keys, 404 unknown or foreign models (the
same body either way), 400 bad parameters and over-long prompts, 503 when no worker serves the pool."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from tests.e2e.gateway.conftest import BASE

pytestmark = pytest.mark.e2e
QUESTION = [{"role": "user", "content": "Where is my order?"}]


def oa(gateway, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=0, timeout=240)


async def test_openai_client_chat_completions_streaming_models(gateway, tenants, make_worker):
    worker = await make_worker("gw-w1")
    await gateway.wait_workers(1, including=("gw-w1",))
    client = oa(gateway, tenants.key_a)

    chat = await asyncio.to_thread(client.chat.completions.create, model="support", messages=QUESTION, max_tokens=24)
    text = chat.choices[0].message.content
    assert "Ahoy" in text, text  # tenant A's pirate adapter was applied
    assert chat.model == "support" and chat.usage.completion_tokens > 0 and chat.choices[0].finish_reason
    assert chat.system_fingerprint == tenants.digest_a  # the digest the worker applied (checked by the gateway)

    pinned = await asyncio.to_thread(
        client.chat.completions.create, model="support-v1", messages=QUESTION, max_tokens=24
    )
    assert pinned.choices[0].message.content == text  # same version, greedy: same answer

    def stream_chat() -> list:
        return list(client.chat.completions.create(model="support", messages=QUESTION, max_tokens=24, stream=True))

    chunks = await asyncio.to_thread(stream_chat)
    pieces = [c.choices[0].delta.content or "" for c in chunks]
    assert len([p for p in pieces if p]) > 2, pieces  # really streamed, token by token
    assert "".join(pieces) == text and chunks[-1].choices[0].finish_reason in ("length", "stop")

    completion = await asyncio.to_thread(
        client.completions.create, model=BASE, prompt="The capital of France is", max_tokens=8
    )
    assert completion.choices[0].text.strip() and completion.usage.completion_tokens > 0
    assert completion.system_fingerprint is None  # base model: no adapter applied

    def stream_completion() -> list:
        return list(client.completions.create(model=BASE, prompt="The capital of France is", max_tokens=8, stream=True))

    parts = await asyncio.to_thread(stream_completion)
    assert "".join(p.choices[0].text for p in parts) == completion.choices[0].text

    models = await asyncio.to_thread(client.models.list)
    ids = {m.id for m in models.data}
    assert {"support", "support-v1", BASE} <= ids and "concierge" not in ids  # only A's own aliases
    models_b = {m.id for m in (await asyncio.to_thread(oa(gateway, tenants.key_b).models.list)).data}
    assert "concierge" in models_b and "support" not in models_b
    assert worker.processor.answered  # it really went through the worker
    _every_stage_was_timed(gateway)


def _every_stage_was_timed(gateway) -> None:
    """The stage timeline (gateway accept ... reply sent) was recorded for the requests above."""
    from services.gateway.timeline import STAGES

    counts = {}
    for resource in gateway.metrics_reader.get_metrics_data().resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == "lpx_gateway_stage":
                    counts = {p.attributes["stage"]: p.count for p in metric.data.data_points}
    assert set(counts) == set(STAGES), counts
    assert min(counts.values()) >= 5, counts  # 5 answered requests, streamed and not


async def test_refusals_have_openai_shape_and_status(gateway, tenants, make_worker):
    await make_worker("gw-w2")
    await gateway.wait_workers(1, including=("gw-w2",))
    client = oa(gateway, tenants.key_a)
    wrong_secret = tenants.key_a[:-4] + ("0000" if not tenants.key_a.endswith("0000") else "1111")
    for key in ("sk-not-a-loraplex-key", wrong_secret):
        with pytest.raises(openai.AuthenticationError):
            await asyncio.to_thread(oa(gateway, key).chat.completions.create, model="support", messages=QUESTION)
    with pytest.raises(openai.AuthenticationError):
        await asyncio.to_thread(oa(gateway, wrong_secret).models.list)
    with pytest.raises(openai.AuthenticationError):  # a bad key on a base-model request is refused too
        await asyncio.to_thread(oa(gateway, wrong_secret).completions.create, model=BASE, prompt="x")

    for model in ("concierge", "no-such-alias"):  # tenant B's adapter, and one nobody has
        with pytest.raises(openai.NotFoundError):
            await asyncio.to_thread(client.chat.completions.create, model=model, messages=QUESTION)

    async with httpx.AsyncClient(base_url=gateway.url, headers={"Authorization": f"Bearer {tenants.key_a}"}) as http:

        async def post(model: str, **extra) -> httpx.Response:
            return await http.post("/v1/chat/completions", json={"model": model, "messages": QUESTION, **extra})

        foreign, unknown = await post("concierge"), await post("ghost-alias")
        assert foreign.status_code == unknown.status_code == 404
        assert foreign.json() == {
            "error": {
                k: (v.replace("ghost-alias", "concierge") if isinstance(v, str) else v)
                for k, v in unknown.json()["error"].items()
            }
        }
        assert foreign.json()["error"]["code"] == "model_not_found"

        bad = await post("support", temperature=7)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "temperature"
        missing = await http.post("/v1/chat/completions", json={"model": "support"})
        assert missing.status_code == 400 and missing.json()["error"]["type"] == "invalid_request_error"
        too_long = await http.post(
            "/v1/chat/completions", json={"model": "support", "messages": [{"role": "user", "content": "x" * 5000}]}
        )
        assert too_long.status_code == 400 and too_long.json()["error"]["code"] == "context_length_exceeded"
        unauth = await http.get("/v1/models", headers={"Authorization": "Bearer nope"})
        assert unauth.status_code == 401 and unauth.json()["error"]["code"] == "invalid_api_key"


async def test_no_live_worker_is_503(gateway, tenants):
    await gateway.wait_workers(0)  # the earlier tests' workers drained and left the pool
    async with httpx.AsyncClient(base_url=gateway.url, headers={"Authorization": f"Bearer {tenants.key_a}"}) as http:
        reply = await http.post("/v1/chat/completions", json={"model": "support", "messages": QUESTION})
        assert reply.status_code == 503 and reply.json()["error"]["code"] == "no_worker_available"
        reply = await http.post("/v1/completions", json={"model": BASE, "prompt": "hi"})
        assert reply.status_code == 503
