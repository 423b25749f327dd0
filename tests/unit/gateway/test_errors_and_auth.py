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


@pytest.mark.parametrize("code,status,err", [
    ("unauthorized", 401, "invalid_api_key"), ("not_found", 404, "model_not_found"),
    ("bad_request", 404, "model_not_found"), ("not_active", 404, "model_not_active"),
    ("unavailable", 503, "registry_unavailable"),
])  # fmt: skip
def test_registry_codes_map_to_statuses(code, status, err):
    exc = _refusal(code, "support")
    assert (exc.status, exc.code) == (status, err)


def test_unknown_and_foreign_models_read_the_same():
    # "unknown alias" and "another tenant's alias" both come back from the registry as not_found
    assert _refusal("not_found", "m").body() == errors.unknown_model("m").body()


@pytest.mark.parametrize("code,status", [("deadline", 504), ("bad_request", 400), ("adapter_unavailable", 503),
                                         ("digest_mismatch", 502), ("engine_error", 502), ("whatever", 502)])
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


def test_sampling_validation_is_a_400_naming_the_parameter():
    body = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], temperature=5)
    with pytest.raises(GatewayError) as info:
        body.sampling(128)
    assert info.value.status == 400 and info.value.param == "temperature"
    with pytest.raises(GatewayError) as info:
        ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], n=3).sampling(128)
    assert info.value.param == "n"
    ok = CompletionRequest(model="m", prompt="x", stop="END", max_tokens=7).sampling(16)
    assert ok.stop == ["END"] and ok.max_tokens == 7 and ok.temperature == 0.0


def test_content_parts_are_joined():
    body = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": [{"type": "text", "text": "a"},
                                                                                    {"type": "text", "text": "b"}]}])
    assert body.messages[0].to_contract().content == "ab"


def test_error_results_carry_their_code():
    result = InferenceResult(request_id="r", worker_id="w", ok=False, error=ErrorInfo(code="deadline", message="late"))
    assert errors.from_worker(result.error.code, result.error.message).code == "deadline_exceeded"
