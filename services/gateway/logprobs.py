"""Token log-probabilities in OpenAI's two shapes, read the way `vllm serve` reads vLLM's output.

The worker sends each generated token with its alternatives in the engine's order (the sampled token
first, then the most likely others). Chat shows `top_logprobs` of them per token; the completions API
shows `logprobs` + 1 (OpenAI's definition), as a token -> logprob map.
"""

from __future__ import annotations

from libs.contracts import MAX_LOGPROBS, TokenLogprob

# A result travels as one NATS message (1 MiB at most): each token with its alternatives is ~50 bytes
# of JSON per entry, so a request may ask for at most this many entries (max_tokens x (alternatives + 2)).
MAX_LOGPROB_ENTRIES = 16_384


def check_budget(max_tokens: int, alternatives: int) -> str | None:
    """Why a request's logprobs would not fit in one result message, or None when they do."""
    entries = max_tokens * (alternatives + 2)
    if entries <= MAX_LOGPROB_ENTRIES:
        return None
    most = MAX_LOGPROB_ENTRIES // (alternatives + 2)
    return (
        f"with {alternatives} alternatives per token at most {most} tokens can carry logprobs "
        f"(max_tokens x (alternatives + 2) <= {MAX_LOGPROB_ENTRIES}); lower max_tokens or the alternatives"
    )


def _bytes(token: str) -> list[int]:
    return list(token.encode("utf-8", errors="replace"))


def chat(tokens: list[TokenLogprob], top: int) -> dict:
    """`choices[].logprobs` of a chat completion (or of one streamed chunk)."""
    top = min(top, MAX_LOGPROBS)
    content = [
        {
            "token": t.token,
            "logprob": t.logprob,
            "bytes": _bytes(t.token),
            "top_logprobs": [{"token": a.token, "logprob": a.logprob, "bytes": _bytes(a.token)} for a in t.top[:top]],
        }
        for t in tokens
    ]
    return {"content": content}


def completion(tokens: list[TokenLogprob], top: int, text_offset: int = 0) -> dict:
    """`choices[].logprobs` of a text completion; `text_offset` is where these tokens' text starts
    (the text already streamed, for a chunk)."""
    offsets = []
    for t in tokens:
        offsets.append(text_offset)
        text_offset += len(t.token)
    return {
        "tokens": [t.token for t in tokens],
        "token_logprobs": [t.logprob for t in tokens],
        "top_logprobs": [{a.token: a.logprob for a in t.top[: top + 1]} for t in tokens],
        "text_offset": offsets,
    }
