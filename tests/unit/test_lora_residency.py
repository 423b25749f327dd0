"""The vLLM engine asks its model runner for the loaded adapters only when they may have changed: each
ask sets vLLM's model-runner process busy-waiting for a second, and the worker's heartbeat reads them
every 2 s (an idle worker burned half a core)."""

from __future__ import annotations

from libs.engine.vllm_engine import _LoraResidency


async def test_idle_reads_are_answered_from_the_last_ask_and_a_change_asks_again():
    asked: list[int] = []
    loaded = {1}

    async def ask() -> list[int]:
        asked.append(1)
        return sorted(loaded)

    residency = _LoraResidency()
    assert await residency.read(ask) == {1} and len(asked) == 1
    assert await residency.read(ask) == {1} and len(asked) == 1  # idle: nothing could have changed
    async with residency.changing():
        loaded.add(2)
        assert await residency.read(ask) == {1, 2} and len(asked) == 2
        assert await residency.read(ask) == {1, 2} and len(asked) == 3  # while generating: always asked
    loaded.discard(1)  # the engine evicted one as the generation ended
    assert await residency.read(ask) == {2} and len(asked) == 4
    assert await residency.read(ask) == {2} and len(asked) == 4
