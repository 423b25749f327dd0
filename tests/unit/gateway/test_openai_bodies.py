"""The OpenAI response bodies the gateway sends, built from the documented models of schemas.py: the
exact JSON OpenAI's clients read (keys absent where OpenAI leaves them out, null where it sends null)."""

from __future__ import annotations

import json

from libs.contracts import InferenceResult, TokenLogprob
from services.gateway.openai_replies import Reply, model_list
from services.gateway.openai_stream import _data

RESULT = InferenceResult(
    request_id="r",
    worker_id="w",
    ok=True,
    text="hi",
    adapter_digest_applied="d" * 64,
    prompt_tokens=3,
    completion_tokens=2,
)


def test_chat_completion_body():
    body = Reply("chat", "r1", "support", None, created=7).body(RESULT).model_dump()
    assert body == {
        "id": "chatcmpl-r1",
        "object": "chat.completion",
        "created": 7,
        "model": "support",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "hi"}, "logprobs": None, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
        "system_fingerprint": "d" * 64,
    }


def test_completion_body_with_logprobs():
    result = RESULT.model_copy(update={"logprobs": [TokenLogprob(token="hi", logprob=-0.5)], "finish_reason": "length"})
    body = Reply("completion", "r2", "m", 0, created=7).body(result).model_dump()
    assert body["object"] == "text_completion" and body["id"] == "cmpl-r2"
    assert body["choices"] == [
        {
            "index": 0,
            "text": "hi",
            "logprobs": {"tokens": ["hi"], "token_logprobs": [-0.5], "top_logprobs": [{}], "text_offset": [0]},
            "finish_reason": "length",
        }
    ]


def test_chat_chunks_leave_out_what_they_do_not_carry():
    reply = Reply("chat", "r3", "m", None, created=7)
    first = json.loads(_data(reply.chunk("", None, first=True))[len("data: ") :])
    assert first["choices"] == [
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
    ]
    assert "usage" not in first
    last = json.loads(_data(reply.chunk(None, "stop"))[len("data: ") :])
    assert last["choices"][0]["delta"] == {} and last["choices"][0]["finish_reason"] == "stop"
    usage = json.loads(_data(reply.usage_chunk(RESULT))[len("data: ") :])
    assert usage["choices"] == [] and usage["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    assert list(usage) == ["id", "object", "created", "model", "choices", "usage"]


def test_model_list():
    body = model_list(["smollm2-135m", "support"], {"smollm2-135m"}, "acme").model_dump()
    assert body == {
        "object": "list",
        "data": [
            {"id": "smollm2-135m", "object": "model", "created": 0, "owned_by": "loraplex"},
            {"id": "support", "object": "model", "created": 0, "owned_by": "acme"},
        ],
    }


def test_a_text_chunk_from_the_template_is_byte_for_byte_the_models_own():
    texts = [
        "",
        "ahoy",
        ' "quoted" \\ back',
        "line\nbreak\ttab\r\b\f",
        "\x00\x01\x1f\x7f",
        "é 漢字 🦙",
        "\u2028\u2029",
        "</s>",
    ]
    models = ["support", 'odd "model" \u2063lpx-text\u2063 name']
    for kind in ("chat", "completion"):
        for model in models:
            reply = Reply(kind, "r9", model, None, created=7)
            for text in texts:
                assert reply.text_event(text) == _data(reply.chunk(text, None)), (kind, model, text)
                assert json.loads(reply.text_event(text)[len("data: ") :])["model"] == model
