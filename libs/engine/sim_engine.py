"""A simulated engine for fleet load tests (`LPX_WORKER_ENGINE=sim`), like llm-d's inference simulator.

It runs behind the same worker code as vLLM (tiers, downloads, digest checks, heartbeats, NATS) and
answers in simulated time instead of running a model:

- prefill at `prefill_tok_s` prompt tokens per second, then one token every 1/`decode_tok_s` seconds
  per sequence, or, with a measured profile (`decode_step_s`, benchmarks/calibrate_engine.py), shared
  steps (libs/engine/sim_steps.py): one token per sequence per step, a step's time growing with the
  sequences running and with the prompts it admits, as on the real engine; at most `max_num_seqs`
  sequences at once;
- `max_loras` adapter slots: a sequence whose adapter holds no slot waits for one (vLLM's scheduler
  does the same), and taking a slot costs the host-to-GPU copy of the adapter's bytes
  (`host_to_gpu_gb_s`, the planner's figure: libs/tier_costs.py);
- a host-RAM cache of `max_cpu_loras` adapters, LRU: loading into it costs the adapter's bytes at the
  planner's local-disk rate (`nvme_gb_s`);
- the answer names the adapter the engine applied ("[sim adapter 1a2b3c4d5e6f] ...", or "[sim base]"),
  so isolation stays checkable end to end: a wrong adapter shows in the text itself.

Never the default: vLLM is the engine everywhere else. No model is loaded, so hundreds of simulated
workers fit on one machine.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import AsyncIterator
from pathlib import Path

from pydantic import BaseModel, Field

from libs.engine.base import (
    AdapterSpec,
    EngineConfig,
    GenerationChunk,
    GenerationRequest,
    RequestRejected,
    TokenLogprobs,
)
from libs.engine.profile import EngineProfile
from libs.engine.sim_steps import StepClock
from libs.tier_costs import GB, HOST_TO_GPU_GB_S, NVME_GB_S


class SimProfile(BaseModel):
    """Rates of the simulated engine; tier bandwidths default to the reference figures the capacity
    planner starts from (libs/tier_costs.py)."""

    prefill_tok_s: float = Field(4000.0, gt=0)
    decode_tok_s: float = Field(50.0, gt=0, description="tokens per second per sequence")
    host_to_gpu_gb_s: float = Field(HOST_TO_GPU_GB_S, gt=0)
    nvme_gb_s: float = Field(NVME_GB_S, gt=0)
    chars_per_token: float = Field(4.0, gt=0)
    # A measured cost model (libs/engine/profile.py): decode step time against running sequences, so a
    # full batch slows every sequence in it as on the real engine. None: `decode_tok_s` whatever the batch.
    decode_step_s: dict[int, float] | None = None

    def step_s(self, running: int) -> float:
        if self.decode_step_s is None:
            return 1.0 / self.decode_tok_s
        return EngineProfile(base_model="sim", decode_step_s=self.decode_step_s, prefill_tok_s=1.0).step_s(running)


def simulated_text(digest: str | None, max_tokens: int) -> list[str]:
    """The pieces of a simulated answer: one per token, naming the applied adapter first."""
    head = f"[sim adapter {digest[:12]}]" if digest else "[sim base]"
    return [head, *(f" t{i}" for i in range(1, max_tokens))][:max_tokens]


def adapter_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).iterdir() if f.is_file())


class SimEngine:
    def __init__(self, config: EngineConfig, profile: SimProfile | None = None) -> None:
        self.config = config
        self.profile = profile or SimProfile()
        self._seqs = asyncio.Semaphore(config.max_num_seqs)
        self._host: OrderedDict[int, AdapterSpec] = OrderedDict()  # lora id -> adapter, LRU
        self._slots: dict[int, int] = {}  # lora id -> sequences using the slot
        self._slot_free = asyncio.Condition()
        self._started = False
        self.slot_loads = 0
        self.running = 0  # sequences in the batch now (what a profiled step time depends on)
        self.host_loads = 0
        self._steps = self._step_clock(self.profile)

    @staticmethod
    def _step_clock(profile: SimProfile) -> StepClock | None:
        if profile.decode_step_s is None:
            return None
        measured = EngineProfile(base_model="sim", decode_step_s=profile.decode_step_s, prefill_tok_s=1.0)
        return StepClock(measured.step_s, profile.prefill_tok_s)

    async def start(self) -> None:
        self._started = True

    async def shutdown(self) -> None:
        self._started = False

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        if not self._started:
            raise RuntimeError("engine not started")
        if request.structured:
            raise RequestRejected(
                "the simulated engine cannot constrain its output (response_format); "
                "structured outputs need the vLLM engine"
            )
        prompt = request.prompt or "".join(m.get("content", "") for m in request.messages or [])
        prompt_tokens = max(1, int(len(prompt) / self.profile.chars_per_token))
        pieces = simulated_text(request.adapter.digest if request.adapter else None, request.max_tokens)
        async with self._seqs, self._slot(request.adapter), self._decoding():
            if self._steps is not None:  # a measured profile: shared steps, prompts run inside them
                first = self._steps.join(prompt_tokens)
            else:
                await asyncio.sleep(prompt_tokens / self.profile.prefill_tok_s)
            for i, piece in enumerate(pieces):
                if self._steps is not None:
                    await self._steps.until(first + i)
                elif i:
                    await asyncio.sleep(self.profile.step_s(self.running))
                last = i == len(pieces) - 1
                # The simulated text is certain: each piece has log-probability 0 and no alternative.
                logprobs = [TokenLogprobs(piece, 0.0, ((piece, 0.0),))] if request.logprobs is not None else None
                yield GenerationChunk(
                    text=piece,
                    token_ids=[i],
                    finished=last,
                    finish_reason="length" if last else None,
                    prompt_tokens=prompt_tokens,
                    completion_tokens=i + 1,
                    logprobs=logprobs,
                )

    @contextlib.asynccontextmanager
    async def _decoding(self):
        self.running += 1
        try:
            yield
        finally:
            self.running -= 1
            if self._steps is not None:
                self._steps.leave()

    @contextlib.asynccontextmanager
    async def _slot(self, adapter: AdapterSpec | None):
        if adapter is None:
            yield
            return
        lora_id = adapter.lora_id
        if lora_id not in self._host:
            await self.add_adapter(adapter)
        async with self._slot_free:
            await self._slot_free.wait_for(lambda: lora_id in self._slots or len(self._slots) < self.config.max_loras)
            loading = lora_id not in self._slots
            self._slots[lora_id] = self._slots.get(lora_id, 0) + 1
        if loading:
            self.slot_loads += 1
            await asyncio.sleep(adapter_bytes(adapter.path) / (self.profile.host_to_gpu_gb_s * GB))
        try:
            yield
        finally:
            async with self._slot_free:
                self._slots[lora_id] -= 1
                if not self._slots[lora_id]:
                    del self._slots[lora_id]
                self._slot_free.notify_all()

    async def add_adapter(self, adapter: AdapterSpec) -> None:
        lora_id = adapter.lora_id
        if lora_id in self._host:
            self._host.move_to_end(lora_id)
            return
        if not (Path(adapter.path) / "adapter_config.json").is_file():
            raise RuntimeError(f"no adapter at {adapter.path}")
        self.host_loads += 1
        await asyncio.sleep(adapter_bytes(adapter.path) / (self.profile.nvme_gb_s * GB))
        self._host[lora_id] = adapter
        while len(self._host) > self.config.max_cpu_loras:
            self._host.popitem(last=False)

    async def score(self, request: GenerationRequest, reference: str) -> list[float]:
        raise NotImplementedError("the simulated engine does not score; the eval gate runs on vLLM")

    async def abort(self, request_id: str) -> None:
        return None

    async def loaded_adapters(self) -> set[int]:
        return set(self._host)
