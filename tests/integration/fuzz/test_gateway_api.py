"""The gateway's OpenAI-compatible API fuzzed from its own OpenAPI (schemathesis) on the live platform
of this package (gateway and simulated worker processes, the registry with a tenant). No input may
give a server error (500), every status and body must be the documented ones."""

from __future__ import annotations

import asyncio

import pytest

from tests.fuzz import fuzz, seeds
from tests.integration.fuzz.conftest import GATEWAY

pytestmark = pytest.mark.integration


async def test_no_input_gives_a_server_error_or_an_undocumented_answer(platform, tmp_path):
    runs = []
    for seed in seeds():  # in a thread: the registry answers the gateway from this test's event loop
        run = await asyncio.to_thread(
            fuzz, f"{platform.url}/openapi.json", {"Authorization": f"Bearer {platform.key}"}, tmp_path, seed=seed
        )
        (tmp_path / f"fuzz-{run.seed}.txt").write_text(run.output)
        print(f"gateway API fuzz, {run.summary()} (output: {tmp_path}/fuzz-{run.seed}.txt)")
        runs.append(run)
    for run in runs:
        log = platform.fleet.log_tail(GATEWAY)
        assert run.exit_code == 0, f"{run.summary()}\n{run.output[-6000:]}\ngateway log:\n{log}"
        assert run.cases > 100, run.summary()  # it really generated requests


async def test_the_openai_client_works_against_the_documented_api(platform):
    """The client a user picks for an OpenAI-compatible API, on the bodies the OpenAPI documents."""
    import openai

    from services.gateway.schemas import ChatCompletion, Completion, ErrorResponse

    client = openai.AsyncOpenAI(base_url=f"{platform.url}/v1", api_key=platform.key, max_retries=0)
    messages = [{"role": "user", "content": "Hello"}]
    chat = await client.chat.completions.create(model="smollm2-135m", messages=messages, max_tokens=5)
    ChatCompletion.model_validate(chat.model_dump())
    assert chat.choices[0].message.content.startswith("[sim base]") and chat.usage.completion_tokens == 5
    done = await client.completions.create(model="smollm2-135m", prompt="Paris is", max_tokens=3)
    Completion.model_validate(done.model_dump())
    stream = await client.chat.completions.create(
        model="smollm2-135m", messages=messages, max_tokens=4, stream=True, stream_options={"include_usage": True}
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[-1].usage.completion_tokens == 4
    assert [m.id async for m in client.models.list()] == ["smollm2-135m"]
    with pytest.raises(openai.NotFoundError) as missing:
        await client.chat.completions.create(model="no-such-alias", messages=messages)
    ErrorResponse.model_validate(missing.value.response.json())
    with pytest.raises(openai.BadRequestError) as bad:
        await client.chat.completions.create(model="smollm2-135m", messages=messages, temperature=7)
    assert bad.value.body["param"] == "temperature"
