"""Shared engine steps for the simulated engine when it follows a measured profile.

On the real engine every running sequence advances one token per step, and a step that admits new
sequences also runs their prompts (vLLM's chunked prefill puts them into the same step as the decodes,
within its token budget: a chat prompt of a few dozen tokens fits whole). So a new request slows every
sequence already running by its prompt's prefill time; on a 2-core CPU (270 prompt tokens/s) a flood's
prompts take a large part of each second, which the calm tenant's sequence feels. A step here costs
`step_s(running) + prompt tokens admitted / prefill_tok_s`, and every running sequence waits for it.

Without a profile the simulated engine keeps its independent per-sequence rates (the fleet benchmarks'
configuration: many workers, no batch effects wanted).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class StepClock:
    def __init__(self, step_s: Callable[[int], float], prefill_tok_s: float) -> None:
        self._step_s = step_s
        self._prefill_tok_s = prefill_tok_s
        self.running = 0  # sequences in the batch, those joining at the next step included
        self.steps = 0  # steps completed
        self._admitting = 0  # prompt tokens to prefill in the next step
        self._in_step = False
        self._stepped = asyncio.Condition()
        self._task: asyncio.Task | None = None

    def join(self, prompt_tokens: int) -> int:
        """A sequence enters the batch: its prompt runs in the next step to start, at whose end its first
        token exists. Returns that step's number (the sequence's token i comes with step `first + i`)."""
        self.running += 1
        self._admitting += prompt_tokens
        first = self.steps + (2 if self._in_step else 1)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run())
        return first

    def leave(self) -> None:
        self.running -= 1

    async def until(self, step: int) -> None:
        """Wait for the end of step `step`."""
        async with self._stepped:
            await self._stepped.wait_for(lambda: self.steps >= step)

    async def _run(self) -> None:
        while self.running > 0:
            prompt_tokens, self._admitting = self._admitting, 0
            self._in_step = True
            await asyncio.sleep(self._step_s(self.running) + prompt_tokens / self._prefill_tok_s)
            self._in_step = False
            self.steps += 1
            async with self._stepped:
                self._stepped.notify_all()
