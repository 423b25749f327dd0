"""Engine-neutral types: what a caller asks for and what it gets back."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from pydantic import BaseModel, Field

# Keep LoRA ids inside a signed 63-bit range that every layer of vLLM accepts.
_LORA_ID_BITS = 62


def lora_int_id(digest: str) -> int:
    """vLLM's integer LoRA id for an adapter version, derived from its content digest, so an id is
    never reused for other bytes during an engine's lifetime."""
    return (int(digest[:16], 16) % ((1 << _LORA_ID_BITS) - 1)) + 1


class EngineConfig(BaseModel):
    """How a worker's (or the eval gate's) engine is set up. Defaults suit SmolLM2 on 2 CPU cores."""

    model_path: Path
    # "vllm" everywhere; "sim" only for fleet load tests (libs/engine/sim_engine.py, no model loaded).
    engine: Literal["vllm", "sim"] = "vllm"
    sim: dict = Field(default_factory=dict, description="SimProfile fields for engine='sim'")
    served_model_name: str = "base"
    device: str = Field("auto", description="auto | cpu | cuda")
    dtype: str = Field("auto", description="auto: bfloat16 on GPU, float32 on CPU (bf16 is emulated there)")
    max_model_len: int = 2048
    enable_lora: bool = True
    max_loras: int = Field(4, description="adapters resident in engine slots at once (batched together)")
    max_cpu_loras: int = Field(16, description="adapters kept in the engine's host-RAM cache")
    max_lora_rank: int = 16
    max_num_seqs: int = 32
    cpu_kvcache_gib: int = Field(1, description="VLLM_CPU_KVCACHE_SPACE on CPU builds")
    gpu_memory_utilization: float = 0.85
    enforce_eager: bool = True
    seed: int = 0
    # JSON from response_format without free whitespace between tokens (vLLM's disable_any_whitespace):
    # with it allowed, an adapter fond of newlines can pad an answer with them up to max_tokens.
    compact_json: bool = True


@dataclass(frozen=True)
class AdapterSpec:
    """An adapter the engine should apply: identified by digest, loaded from a local directory."""

    digest: str
    path: Path

    @property
    def lora_id(self) -> int:
        return lora_int_id(self.digest)


@dataclass
class GenerationRequest:
    request_id: str
    prompt: str | None = None
    messages: list[dict] | None = None
    max_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    adapter: AdapterSpec | None = None
    trace_headers: dict[str, str] | None = None
    logprobs: int | None = None  # alternatives per generated token; None: no logprobs
    # Constrained decoding: {"json": <schema>} or {"json_object": True} (vLLM's StructuredOutputsParams).
    structured: dict | None = None


@dataclass(frozen=True)
class TokenLogprobs:
    """One generated token's text and log-probability, with the engine's alternatives in its order
    (vLLM: the sampled token first, then the most likely others)."""

    token: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()


class RequestRejected(ValueError):
    """The engine refused the request itself (a parameter it cannot honour): the caller's fault, a 400."""


@dataclass
class GenerationChunk:
    """One streamed step: the new text since the previous chunk; the last one has `finished`."""

    text: str
    token_ids: list[int]
    finished: bool = False
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    logprobs: list[TokenLogprobs] | None = None  # one per token of token_ids, when asked for


class InferenceEngine(Protocol):
    async def start(self) -> None: ...

    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]: ...

    async def score(self, request: GenerationRequest, reference: str) -> list[float]: ...

    async def add_adapter(self, adapter: AdapterSpec) -> None: ...

    async def abort(self, request_id: str) -> None: ...

    async def loaded_adapters(self) -> set[int]: ...

    async def shutdown(self) -> None: ...
