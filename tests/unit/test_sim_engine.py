"""The simulated engine (fleet load tests only): rates, slots, host cache, answers naming the adapter."""

import asyncio
import json
import time

import pytest

from libs.engine import AdapterSpec, EngineConfig, GenerationRequest, create_engine
from libs.engine.sim_engine import SimEngine, simulated_text


def _adapter(tmp_path, name: str, size: int = 1000) -> AdapterSpec:
    path = tmp_path / name
    path.mkdir()
    (path / "adapter_config.json").write_text(json.dumps({"r": 16}))
    (path / "adapter_model.safetensors").write_bytes(b"\0" * size)
    return AdapterSpec(name.encode().hex().ljust(64, "0")[:64], path)


def _engine(**overrides) -> SimEngine:
    config = EngineConfig(model_path="/nonexistent", engine="sim", sim={"decode_tok_s": 200.0}, **overrides)
    return create_engine(config)


async def _answer(engine, rid: str, adapter=None, max_tokens: int = 5) -> str:
    request = GenerationRequest(rid, prompt="hello there", max_tokens=max_tokens, adapter=adapter)
    chunks = [c async for c in engine.generate(request)]
    assert chunks[-1].finished and chunks[-1].completion_tokens == max_tokens
    return "".join(c.text for c in chunks)


def test_create_engine_never_picks_the_simulator_by_default():
    assert EngineConfig(model_path="/m").engine == "vllm"
    assert isinstance(_engine(), SimEngine)


async def test_answers_name_the_applied_adapter_and_decode_at_the_configured_rate(tmp_path):
    engine = _engine()
    await engine.start()
    adapter = _adapter(tmp_path, "a1")
    started = time.monotonic()
    text = await _answer(engine, "r1", adapter, max_tokens=21)
    assert text.startswith(f"[sim adapter {adapter.digest[:12]}]")
    assert time.monotonic() - started >= 20 / 200.0  # 20 inter-token gaps at 200 tok/s
    assert (await _answer(engine, "r2")).startswith("[sim base]")
    assert simulated_text(None, 3) == ["[sim base]", " t1", " t2"]


async def test_slots_bound_the_adapters_generating_at_once(tmp_path):
    engine = _engine(max_loras=1, max_cpu_loras=4)
    await engine.start()
    a, b = _adapter(tmp_path, "a"), _adapter(tmp_path, "b")
    await asyncio.gather(*(_answer(engine, f"r{i}", (a, b)[i % 2], max_tokens=4) for i in range(6)))
    assert engine.slot_loads >= 2  # one slot: the two adapters took turns
    assert await engine.loaded_adapters() == {a.lora_id, b.lora_id}


async def test_host_cache_is_lru_bounded_and_refuses_a_missing_adapter(tmp_path):
    engine = _engine(max_cpu_loras=2)
    await engine.start()
    specs = [_adapter(tmp_path, f"x{i}") for i in range(3)]
    for spec in specs:
        await engine.add_adapter(spec)
    assert await engine.loaded_adapters() == {specs[1].lora_id, specs[2].lora_id}
    with pytest.raises(RuntimeError, match="no adapter"):
        await engine.add_adapter(AdapterSpec("f" * 64, tmp_path / "missing"))
