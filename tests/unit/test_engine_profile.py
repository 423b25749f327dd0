"""The engine profile (libs/engine/profile.py): step time against running sequences, the batch that keeps
a latency bound, a missing or malformed profile falling back with one log line; the simulated engine
following a profile (a full batch slows each of its sequences)."""

import asyncio
import logging
import time

import pytest

from libs.engine import EngineConfig, GenerationRequest, create_engine
from libs.engine.profile import EngineProfile, default_profile_path, load_profile

STEPS = {1: 0.010, 2: 0.012, 4: 0.014, 8: 0.020, 16: 0.036}


def _profile() -> EngineProfile:
    return EngineProfile(base_model="m", decode_step_s=STEPS, prefill_tok_s=1000.0)


def test_step_time_is_measured_interpolated_and_extended_along_the_last_slope():
    p = _profile()
    assert p.step_s(4) == 0.014 and p.step_s(0) == 0.010
    assert p.step_s(6) == pytest.approx(0.017)
    assert p.step_s(24) == pytest.approx(0.036 + 0.002 * 8)


def test_the_protected_batch_is_the_largest_within_the_bound_and_at_least_one():
    p = _profile()
    assert p.batch_within(1.4, 16) == 4
    assert p.batch_within(2.0, 16) == 8
    assert p.batch_within(10.0, 12) == 12  # never past the worker's own limit
    assert p.batch_within(1.01, 16) == 1


def test_a_missing_or_malformed_profile_falls_back_and_says_why_once(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    assert load_profile(tmp_path / "none.json", "m") is None
    bad = tmp_path / "bad.json"
    bad.write_text('{"base_model": "m", "decode_step_s": {"2": 0.1}, "prefill_tok_s": 100}')
    assert load_profile(bad, "m") is None
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and "no engine profile" in lines[0] and "malformed" in lines[1]


def test_the_demo_models_profile_ships_and_loads():
    profile = load_profile(None, "smollm2-135m", "cpu")
    assert profile is not None and default_profile_path("smollm2-135m").is_file()
    assert profile.step_s(16) > profile.solo_step_s  # measured: a full CPU batch is slower per step


async def test_the_simulated_engine_slows_every_sequence_of_a_full_batch():
    config = EngineConfig(model_path="/none", engine="sim", sim={"prefill_tok_s": 1e6, "decode_step_s": STEPS})
    engine = create_engine(config)
    await engine.start()

    async def one(i: int) -> float:
        started = time.monotonic()
        async for _ in engine.generate(GenerationRequest(f"r{i}", prompt="hi", max_tokens=11)):
            pass
        return time.monotonic() - started

    alone = await one(0)
    together = await asyncio.gather(*(one(i) for i in range(1, 17)))
    assert alone == pytest.approx(10 * 0.010, rel=0.5)
    assert min(together) > 2 * alone  # 16 running: 0.036 s a step instead of 0.010


async def test_a_new_prompt_slows_every_sequence_running_on_the_simulated_engine():
    """With a profile, the simulated engine's steps are shared and a step that admits a sequence also runs
    its prompt (chunked prefill, as vLLM does): prompts arriving beside a running sequence slow it."""
    steps = {1: 0.01, 16: 0.01}
    config = EngineConfig(model_path="/none", engine="sim", sim={"prefill_tok_s": 1000.0, "decode_step_s": steps})
    engine = create_engine(config)
    await engine.start()

    async def one(i: int, prompt: str, tokens: int) -> float:
        started = time.monotonic()
        async for _ in engine.generate(GenerationRequest(f"r{i}", prompt=prompt, max_tokens=tokens)):
            pass
        return time.monotonic() - started

    alone = await one(0, "x" * 40, 21)  # 10 prompt tokens: 0.01 s in its first step, then 20 steps
    assert alone == pytest.approx(0.01 + 21 * 0.01, rel=0.3)

    async def prompts_arriving():
        for i in range(5):
            await asyncio.sleep(0.03)
            await one(100 + i, "y" * 400, 1)  # 100 prompt tokens each: 0.1 s inside a shared step

    calm, _ = await asyncio.gather(one(1, "x" * 40, 21), prompts_arriving())
    assert calm > alone + 0.4  # the five prompts' 0.5 s of prefill ran inside its steps
