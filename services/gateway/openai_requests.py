"""The OpenAI-compatible request bodies (/v1/chat/completions, /v1/completions): the subset of
OpenAI's parameters a LoRA worker honours, and how a refused body is described in OpenAI's words."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from libs.contracts import MAX_LOGPROBS, ChatMessage, SamplingParams, StructuredOutput
from services.gateway import errors, logprobs

MAX_NEW_TOKENS = SamplingParams.model_fields["max_tokens"].metadata[-1].le
MAX_STOP = SamplingParams.model_fields["stop"].metadata[-1].max_length
MAX_SEED = 2**63 - 1

MAX_TEXT = 1_000_000  # characters of one field; the prompt as a whole is bounded by max_prompt_chars
MAX_PARTS = 1_000  # messages, content parts
Text = Annotated[str, Field(max_length=MAX_TEXT)]
StopText = Annotated[str, Field(max_length=1_000)]


# Honour or refuse, never ignore: a parameter OpenAI documents that loraplex does not implement is
# accepted only at its "off" value and refused with 400 naming it otherwise; an unknown one is refused.
UNSUPPORTED = {
    "tools",
    "tool_choice",
    "functions",
    "function_call",
    "frequency_penalty",
    "presence_penalty",
    "logit_bias",
    "modalities",
    "audio",
    "prediction",
    "reasoning_effort",
    "web_search_options",
    "best_of",
    "echo",
    "suffix",
}
NOT_SUPPORTED = "not supported by this server (refused with 400, never ignored)"
Off = Annotated[None, Field(description=NOT_SUPPORTED)]
Zero = Annotated[float | None, Field(None, ge=0, le=0, description=f"0 only; {NOT_SUPPORTED}")]
Empty = Annotated[dict | list | None, Field(None, max_length=0, description=f"empty only; {NOT_SUPPORTED}")]


class _ContentPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: str = Field(max_length=MAX_TEXT)


class ChatMessageIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant", "developer"]
    content: Text | Annotated[list[_ContentPart], Field(max_length=MAX_PARTS)]
    name: str | None = Field(None, max_length=256, description="accepted, not used")

    def to_contract(self) -> ChatMessage:
        text = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        return ChatMessage(role="system" if self.role == "developer" else self.role, content=text)


class TextFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]


class JsonObjectFormat(BaseModel):
    """Any JSON object: decoding is constrained by vLLM's structured outputs, not asked for politely."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["json_object"]


class JsonSchemaSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = Field(None, max_length=MAX_TEXT)
    schema_: dict | None = Field(
        None,
        alias="schema",
        description="a JSON Schema (draft 2020-12; an invalid one is refused with 400); absent: any JSON object",
    )
    strict: bool | None = Field(None, description="accepted; decoding always follows the schema")


class JsonSchemaFormat(BaseModel):
    """JSON valid against `json_schema.schema`: decoding is constrained to it (vLLM structured outputs)."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


ResponseFormat = Annotated[TextFormat | JsonObjectFormat | JsonSchemaFormat, Field(discriminator="type")]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str = Field(min_length=1, max_length=256, description="an adapter alias of your tenant or a base model")
    max_tokens: int | None = Field(None, ge=1, le=MAX_NEW_TOKENS)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    stop: StopText | Annotated[list[StopText], Field(max_length=MAX_STOP)] | None = None
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int | None = Field(None, ge=1, le=1, description="only 1 is supported")
    user: str | None = Field(None, max_length=256, description="accepted for OpenAI compatibility, not used")
    metadata: dict[str, Annotated[str, Field(max_length=512)]] | None = Field(None, max_length=16)
    store: bool | None = Field(None, description="accepted, nothing is stored")
    service_tier: str | None = Field(None, max_length=32, description="accepted, not used")
    frequency_penalty: Zero = None
    presence_penalty: Zero = None
    logit_bias: Empty = None

    def alternatives(self) -> int | None:
        """How many alternatives per generated token the caller wants with logprobs; None: no logprobs."""
        return None

    def structured(self) -> StructuredOutput | None:
        return None

    def sampling(self, default_max_tokens: int) -> SamplingParams:
        if self.n not in (None, 1):
            raise errors.bad_request("only n=1 is supported", "n")
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        max_tokens = self.max_tokens or default_max_tokens
        alternatives = self.alternatives()
        if alternatives is not None and (why := logprobs.check_budget(max_tokens, alternatives)):
            raise errors.bad_request(why, "max_tokens")
        values = {
            "max_tokens": max_tokens,
            "stop": stop,
            "seed": self.seed,
            "logprobs": alternatives,
            "structured": self.structured(),
        }
        if self.temperature is not None:
            values["temperature"] = self.temperature
        if self.top_p is not None:
            values["top_p"] = self.top_p
        try:
            return SamplingParams(**values)
        except ValidationError as exc:
            first = exc.errors()[0]
            param = ".".join(str(p) for p in first.get("loc", ())) or None
            raise errors.bad_request(f"invalid {param}: {first.get('msg')}", param) from None


class ChatCompletionRequest(_Common):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"model": "smollm2-135m", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 16},
                {
                    "model": "smollm2-135m",
                    "messages": [{"role": "user", "content": "Hi"}],
                    "stream": True,
                    "stream_options": {"include_usage": True},
                },
            ]
        },
    )
    messages: list[ChatMessageIn] = Field(min_length=1, max_length=MAX_PARTS)
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_NEW_TOKENS)
    logprobs: bool | None = Field(None, description="log-probabilities of the generated tokens")
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS, description="alternatives per token (needs logprobs)")
    response_format: ResponseFormat | None = Field(
        None, description="text (default), json_object or json_schema: structured outputs with the adapter applied"
    )
    tools: Empty = None
    tool_choice: Literal["none"] | None = Field(None, description=f'"none" only; {NOT_SUPPORTED}')
    parallel_tool_calls: bool | None = Field(None, description="accepted (no tools are called)")
    functions: Empty = None
    function_call: Literal["none"] | None = Field(None, description=f'"none" only; {NOT_SUPPORTED}')
    modalities: list[Literal["text"]] | None = Field(None, max_length=1, description="text only")
    audio: Off = None
    prediction: Off = None
    reasoning_effort: Off = None
    web_search_options: Off = None

    def alternatives(self) -> int | None:
        if self.top_logprobs and not self.logprobs:
            raise errors.bad_request("top_logprobs needs logprobs to be true", "top_logprobs")
        return (self.top_logprobs or 0) if self.logprobs else None

    def structured(self) -> StructuredOutput | None:
        fmt = self.response_format
        if fmt is None or fmt.type == "text":
            return None
        if fmt.type == "json_object" or fmt.json_schema.schema_ is None:
            return StructuredOutput(kind="json_object")
        try:
            return StructuredOutput(kind="json_schema", json_schema=fmt.json_schema.schema_)
        except ValidationError as exc:
            reason = str(exc.errors()[0].get("ctx", {}).get("error") or exc.errors()[0].get("msg"))
            raise errors.bad_request(f"response_format.json_schema.schema: {reason}", "response_format") from None


class CompletionRequest(_Common):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"model": "smollm2-135m", "prompt": "The capital of France is", "max_tokens": 8},
            ]
        },
    )
    prompt: Text | Annotated[list[Text], Field(min_length=1, max_length=1)] = Field(
        description="one prompt (a list of exactly one is accepted)"
    )
    echo: Literal[False] = Field(False, description=f"false only; {NOT_SUPPORTED}")
    suffix: Literal[""] | None = Field(None, description=f"empty only; {NOT_SUPPORTED}")
    logprobs: int | None = Field(
        None,
        ge=0,
        le=MAX_LOGPROBS,
        description="log-probabilities with this many alternatives per token (+1, as OpenAI counts)",
    )
    best_of: Literal[1] | None = Field(None, description=f"1 only; {NOT_SUPPORTED}")

    def alternatives(self) -> int | None:
        return self.logprobs


def describe_invalid(error: dict) -> tuple[str, str | None]:
    """(message, param) of a request validation error, in OpenAI's words where it has them."""
    loc = [str(p) for p in error.get("loc", ()) if p != "body"]
    param = loc[0] if loc else None
    if error.get("type") == "extra_forbidden":
        return f"Unrecognized request argument supplied: {'.'.join(loc)}", param
    if param in UNSUPPORTED and len(loc) <= 2:
        return f"{param} is {NOT_SUPPORTED}: {error.get('msg', 'invalid')}", param
    return f"invalid request: {'.'.join(loc) or 'body'}: {error.get('msg', 'invalid')}", param
