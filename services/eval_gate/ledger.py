"""The gate's ledger of finished evaluations (a JetStream key-value bucket): source event id -> the
EvaluationResult it published. A redelivered event (the gate crashed after publishing, before the
ack) gets the same result re-published (de-duplicated by JetStream on its Nats-Msg-Id, and a no-op in
the registry, which matches results by event id) instead of a second evaluation."""

from __future__ import annotations

import hashlib

from nats.js.api import KeyValueConfig
from nats.js.errors import KeyNotFoundError

from libs.contracts import EvaluationResult, subjects

KEEP_S = 30 * 24 * 3600.0


def result_event_id(source_event_id: str) -> str:
    """The verdict's own event id, derived from the event it answers: one verdict per event."""
    return hashlib.sha256(f"eval:{source_event_id}".encode()).hexdigest()[:32]


def ledger_config() -> KeyValueConfig:
    return KeyValueConfig(
        bucket=subjects.EVAL_LEDGER_BUCKET, history=1, ttl=KEEP_S, description="eval gate: finished evaluations"
    )


class Ledger:
    def __init__(self, kv) -> None:
        self.kv = kv

    @classmethod
    async def open(cls, js) -> Ledger:
        """The ledger bucket, once the service's BrokerLink has provisioned `ledger_config()`."""
        return cls(await js.key_value(subjects.EVAL_LEDGER_BUCKET))

    async def get(self, source_event_id: str) -> EvaluationResult | None:
        try:
            entry = await self.kv.get(source_event_id)
        except KeyNotFoundError:
            return None
        return EvaluationResult.model_validate_json(entry.value) if entry.value else None

    async def put(self, source_event_id: str, result: EvaluationResult) -> None:
        await self.kv.put(source_event_id, result.model_dump_json().encode())
