"""The segment-grouped CPU LoRA ops in a real engine: token for token what vLLM's own ops give, and
what transformers + peft give, with adapters of ranks 8 and 16 and base-model rows in the same batches."""

from __future__ import annotations

import asyncio
import hashlib

import pytest

from tests.adapters import noise_adapters, tone_adapter

pytestmark = pytest.mark.e2e

QUESTIONS = ["Where is my order?", "Can you help me with my account?"]


@pytest.fixture(scope="module")
def mixed_adapters(base_model_path):
    """Two rank-8 and two rank-16 adapters (distinct random weights) and a trained rank-16 tone adapter."""
    return {
        "pirate": tone_adapter(base_model_path, "pirate"),
        **{f"r8-{i}": p for i, p in enumerate(noise_adapters(base_model_path, 2, rank=8))},
        **{f"r16-{i}": p for i, p in enumerate(noise_adapters(base_model_path, 2, rank=16))},
    }


async def _batch(engine, adapters: dict, tag: str) -> dict[tuple[str, str], str]:
    """Every adapter and the base model on every question, all at once (one mixed batch)."""
    from libs.engine import AdapterSpec, GenerationRequest

    async def one(i: int, name: str, path, question: str) -> tuple[tuple[str, str], str]:
        spec = AdapterSpec(hashlib.sha256(str(path).encode()).hexdigest(), path) if path is not None else None
        request = GenerationRequest(
            f"{tag}-{i}", messages=[{"role": "user", "content": question}], max_tokens=16, adapter=spec
        )
        text = "".join([chunk.text async for chunk in engine.generate(request)])
        return (name, question), text

    plan = [(name, path, q) for q in QUESTIONS for name, path in [*adapters.items(), ("base", None)]]
    pairs = await asyncio.gather(*(one(j, name, path, q) for j, (name, path, q) in enumerate(plan)))
    return dict(pairs)


async def test_grouped_ops_match_vllms_ops_and_peft(engine, base_model_path, mixed_adapters, monkeypatch):
    from libs.engine import EngineConfig, create_engine
    from libs.engine.vllm_patches import OPS_ENV
    from libs.lora.train import peft_generate

    grouped = await _batch(engine, mixed_adapters, "grouped")  # the session engine: loraplex's default ops
    monkeypatch.setenv(OPS_ENV, "vllm")  # read by the plugin in the new engine's own process
    reference_engine = create_engine(EngineConfig(model_path=base_model_path, max_loras=2, max_cpu_loras=6))
    await reference_engine.start()
    try:
        vllm_ops = await _batch(reference_engine, mixed_adapters, "vllm")
    finally:
        await reference_engine.shutdown()
    assert grouped == vllm_ops
    for question in QUESTIONS:  # every adapter made a difference (a no-op op would pass the comparison)
        answers = [text for (_name, q), text in grouped.items() if q == question]
        assert len(set(answers)) == len(answers), answers
    for name in ("pirate", "r8-0", "r16-1"):
        question = QUESTIONS[0]
        reference = peft_generate(base_model_path, mixed_adapters[name], [{"role": "user", "content": question}], 16)
        assert grouped[(name, question)].strip() == reference.strip(), name
