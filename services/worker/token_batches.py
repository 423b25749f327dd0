"""Streamed tokens out of the worker: one message per engine step and gateway (TokenBatch).

vLLM hands each running sequence its new tokens in one event-loop pass: its output handler wakes every
request's stream for an engine step, and each request's task then runs before anything scheduled after
them. A delta added in that pass is kept per gateway and sent by a flush task created with the pass's
first delta, so it runs once every woken request has added its own: the broker and the gateway handle
one message per step, not one per token of every request (on a GPU, thousands a second).

A request without a gateway (`reply_to` None: the shared subjects) keeps one message per delta, and so
does every request with `enabled` off (gateways older than TokenBatch read only per-request subjects).
"""

from __future__ import annotations

import asyncio
import json
import logging

from libs.contracts import TokenDelta, subjects
from services.worker.results import max_payload

log = logging.getLogger(__name__)

# Room left in a batch for its envelope (schema version, worker id) under the broker's max payload.
ENVELOPE_BYTES = 256


class TokenBatches:
    def __init__(self, nc, worker_id: str, *, enabled: bool = True) -> None:
        self.nc = nc
        self.worker_id = worker_id
        self.enabled = enabled
        self._pending: dict[str, list[bytes]] = {}  # gateway -> serialized deltas, in the order added
        self._flusher: asyncio.Task | None = None
        self._head = b'{"schema_version":1,"worker_id":%s,"deltas":[' % json.dumps(worker_id).encode()
        self.messages = 0  # batches sent
        self.deltas = 0  # deltas in them
        self.dropped = 0  # deltas of batches the broker refused (the final result carries the whole text)

    async def send(self, delta: TokenDelta, reply_to: str | None) -> None:
        data = delta.model_dump_json().encode()
        if not self.enabled or reply_to is None:
            await self.nc.publish(subjects.token_subject(delta.request_id, reply_to), data)
            return
        self._pending.setdefault(reply_to, []).append(data)
        if self._flusher is None:
            self._flusher = asyncio.get_running_loop().create_task(self._flush())

    async def drain(self) -> None:
        """Until the deltas added so far are handed to the connection (before a request's result goes out,
        so the gateway gets its last tokens first). Shielded: one request's cancel never stops the flush of
        the others' deltas."""
        if self._flusher is not None:
            await asyncio.shield(self._flusher)

    async def _flush(self) -> None:
        try:
            while self._pending:  # deltas added while a publish waited go in the next round
                pending, self._pending = self._pending, {}
                for gateway, parts in pending.items():
                    await self._publish(gateway, parts)
        finally:
            self._flusher = None

    async def _publish(self, gateway: str, parts: list[bytes]) -> None:
        subject = subjects.token_batch_to(gateway, self.worker_id)
        for batch in _split(parts, max_payload(self.nc) - ENVELOPE_BYTES):
            try:
                await self.nc.publish(subject, self._head + b",".join(batch) + b"]}")
            except Exception as exc:  # tokens are best effort: the result still carries the whole text
                self.dropped += len(batch)
                log.warning("token batch not sent", extra={"subject": subject, "reason": repr(exc)})
                continue
            self.messages += 1
            self.deltas += len(batch)


def _split(parts: list[bytes], budget: int) -> list[list[bytes]]:
    """Consecutive runs of `parts` whose joined size stays within `budget` (a part over it goes alone)."""
    batches: list[list[bytes]] = [[]]
    size = 0
    for part in parts:
        if batches[-1] and size + len(part) + 1 > budget:
            batches.append([])
            size = 0
        batches[-1].append(part)
        size += len(part) + 1
    return batches
