"""OpenAI-shaped errors with the right status, key parsing, and the request-body validation path."""

from __future__ import annotations

import pytest

from libs.contracts import ErrorInfo, InferenceResult
from services.gateway import errors
from services.gateway.app import _refusal
from services.gateway.auth import bearer_key, fingerprint, tenant_of
from services.gateway.errors import GatewayError
from services.gateway.openai_api import ChatCompletionRequest, CompletionRequest

KEY = "lpx_acme_0123456789abcdef_" + "ab" * 32


def test_error_body_has_openai_shape():
    body = errors.unknown_model("x").body()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["code"] == "model_not_found" and body["error"]["param"] == "model"


@pytest.mark.parametrize(
    "code,status,err",
    [
        ("unauthorized", 401, "invalid_api_key"),
        ("not_found", 404, "model_not_found"),
        ("bad_request", 404, "model_not_found"),
        ("not_active", 404, "model_not_active"),
        ("unavailable", 503, "registry_unavailable"),
    ],
)
def test_registry_codes_map_to_statuses(code, status, err):
    exc = _refusal(code, "support")
    assert (exc.status, exc.code) == (status, err)


def test_unknown_and_foreign_models_read_the_same():
    # "unknown alias" and "another tenant's alias" both come back from the registry as not_found
    assert _refusal("not_found", "m").body() == errors.unknown_model("m").body()


@pytest.mark.parametrize(
    "code,status",
    [
        ("deadline", 504),
        ("bad_request", 400),
        ("adapter_unavailable", 503),
        ("digest_mismatch", 502),
        ("engine_error", 502),
        ("whatever", 502),
    ],
)
def test_worker_codes_map_to_statuses(code, status):
    assert errors.from_worker(code, "m").status == status


def test_key_parsing():
    assert tenant_of(KEY) == "acme"
    assert tenant_of("sk-123") is None and tenant_of("") is None
    assert bearer_key(f"Bearer {KEY}") == (KEY, "acme")
    for header in (None, "", "Basic abc", "Bearer ", "Bearer nope", f"Token {KEY}"):
        with pytest.raises(GatewayError) as info:
            bearer_key(header)
        assert info.value.status == 401
    assert KEY not in fingerprint(KEY) and len(fingerprint(KEY)) == 64
    assert tenant_of("lpxr_0123456789abcdef_" + "ab" * 32) is None  # a registry credential: 401 here


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"temperature": 5}, "temperature"),
        ({"n": 3}, "n"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 10**9}, "max_tokens"),
        ({"top_p": 0}, "top_p"),
        ({"seed": 2**70}, "seed"),
        ({"stop": ["x"] * 9}, "stop"),
        ({"messages": [{"role": "user", "content": "x" * 1_000_001}]}, "messages"),
        ({"messages": []}, "messages"),
    ],
)
def test_out_of_range_parameters_are_a_400_naming_the_parameter_in_openais_shape(extra, param):
    from fastapi.testclient import TestClient

    from services.gateway.app import create_app
    from services.gateway.settings import GatewaySettings

    client = TestClient(create_app(GatewaySettings(_env_file=None)))  # no lifespan: refused before any I/O
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}
    reply = client.post("/v1/chat/completions", json=body, headers={"Authorization": "Bearer lpx_x"})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error" and param in error["message"]


def test_an_oversized_body_is_413_before_it_is_read():
    from fastapi.testclient import TestClient

    from services.gateway.app import create_app
    from services.gateway.settings import GatewaySettings

    client = TestClient(create_app(GatewaySettings(_env_file=None, max_body_bytes=4096)))
    body = {"model": "m", "messages": [{"role": "user", "content": "x" * 5000}]}
    reply = client.post("/v1/chat/completions", json=body, headers={"Authorization": "Bearer lpx_x"})
    assert reply.status_code == 413 and reply.json()["error"]["code"] == "request_too_large"
    deep = "[" * 100_000 + "]" * 100_000  # nesting deeper than the JSON parser recurses: 400, not 500
    client = TestClient(create_app(GatewaySettings(_env_file=None)))
    reply = client.post(
        "/v1/completions", content=deep, headers={"Authorization": "Bearer lpx_x", "Content-Type": "application/json"}
    )
    assert reply.status_code == 400 and reply.json()["error"]["type"] == "invalid_request_error"


def test_sampling_keeps_what_was_asked():
    ok = CompletionRequest(model="m", prompt="x", stop="a long stop string", max_tokens=7).sampling(16)
    assert ok.stop == ["a long stop string"] and ok.max_tokens == 7 and ok.temperature == 0.0


def test_content_parts_are_joined():
    body = ChatCompletionRequest(
        model="m",
        messages=[{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
    )
    assert body.messages[0].to_contract().content == "ab"


def test_error_results_carry_their_code():
    result = InferenceResult(request_id="r", worker_id="w", ok=False, error=ErrorInfo(code="deadline", message="late"))
    assert errors.from_worker(result.error.code, result.error.message).code == "deadline_exceeded"


def _post(path: str, body: dict):
    from fastapi.testclient import TestClient

    from services.gateway.app import create_app
    from services.gateway.settings import GatewaySettings

    client = TestClient(create_app(GatewaySettings(_env_file=None)))  # no lifespan: validation only
    return client.post(path, json=body, headers={"Authorization": "Bearer lpx_x"})


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(
    "path, extra, param, words",
    [
        ("/v1/chat/completions", {"temprature": 0.5}, "temprature", "Unrecognized request argument supplied"),
        ("/v1/chat/completions", {"top_logprobs": 3}, "top_logprobs", "needs logprobs to be true"),
        ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs", "less than or equal to 20"),
        (
            "/v1/chat/completions",
            {"logprobs": True, "top_logprobs": 20, "max_tokens": 8000},
            "max_tokens",
            "at most 744 tokens can carry logprobs",
        ),
        (
            "/v1/chat/completions",
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {
                        "name": "p",
                        "schema": {"type": "object", "properties": {"age": {"type": "integr"}}},
                    },
                }
            },
            "response_format",
            "not a valid JSON Schema at properties/age/type",
        ),
        (
            "/v1/chat/completions",
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "p", "schema": {"type": "object"}, "strictly": True},
                }
            },
            "response_format",
            "Unrecognized request argument supplied: response_format.json_schema.json_schema.strictly",
        ),
        ("/v1/chat/completions", {"response_format": {"type": "xml"}}, "response_format", "invalid request"),
        ("/v1/chat/completions", {"tools": [{"type": "function", "function": {}}]}, "tools", "not supported"),
        ("/v1/chat/completions", {"frequency_penalty": 0.5}, "frequency_penalty", "not supported"),
        ("/v1/chat/completions", {"logit_bias": {"50256": -100}}, "logit_bias", "not supported"),
        ("/v1/chat/completions", {"messages": [{"role": "tool", "content": "x"}]}, "messages", "role"),
        ("/v1/completions", {"prompt": "x", "logprobs": 21}, "logprobs", "less than or equal to 20"),
        ("/v1/completions", {"prompt": "x", "best_of": 3}, "best_of", "not supported"),
        ("/v1/completions", {"prompt": "x", "echo": True}, "echo", "not supported"),
    ],
)
def test_a_parameter_that_would_change_the_answer_is_refused_naming_it_never_ignored(path, extra, param, words):
    body = {**({"model": "m"} if path == "/v1/completions" else CHAT), **extra}
    reply = _post(path, body)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param and words in error["message"], error


def test_parameters_at_their_off_value_or_harmless_ones_are_accepted():
    body = {
        **CHAT,
        "logprobs": False,
        "top_logprobs": 0,
        "response_format": {"type": "text"},
        "tools": [],
        "tool_choice": "none",
        "frequency_penalty": 0,
        "presence_penalty": 0.0,
        "logit_bias": {},
        "user": "u-1",
        "metadata": {"team": "a"},
        "store": False,
        "service_tier": "auto",
        "n": 1,
        "messages": [{"role": "user", "content": "hi", "name": "ann"}],
    }
    assert _post("/v1/chat/completions", body).status_code == 401  # past validation: the key is checked next
    assert _post("/v1/completions", {"model": "m", "prompt": "x", "logprobs": 0, "best_of": 1}).status_code == 401


@pytest.mark.parametrize(
    "extra",
    [
        {"logprobs": True},
        {"logprobs": True, "top_logprobs": 20, "max_tokens": 744},
        {"response_format": {"type": "json_object"}},
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {
                    "name": "person",
                    "strict": True,
                    "schema": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
                },
            }
        },
        {"response_format": {"type": "json_schema", "json_schema": {"name": "anything"}}},
    ],
)
def test_implemented_parameters_pass_validation(extra):
    assert _post("/v1/chat/completions", {**CHAT, **extra}).status_code == 401  # the key is checked next
