"""The dead-letter path: a message that cannot be processed is published, with the reason, on
subjects.dead_letter(service), kept by the DLQ stream, instead of being dropped or redelivered for ever."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from pydantic import BaseModel

from libs.contracts import DeadLetter, subjects

log = logging.getLogger(__name__)

MAX_DEAD_LETTER_PAYLOAD = 64 * 1024  # characters of the original payload kept in a dead letter
MAX_DEAD_LETTER_HEADER = 1024


def dead_letter(
    service: str, subject: str, reason: str, payload: bytes | str | BaseModel, headers: Mapping[str, str] | None = None
) -> DeadLetter:
    """The dead-letter record for a message that could not be processed, reason included."""
    if isinstance(payload, BaseModel):
        text = payload.model_dump_json()
    elif isinstance(payload, bytes):
        text = payload.decode("utf-8", errors="replace")
    else:
        text = payload
    size = len(payload) if isinstance(payload, bytes) else len(text.encode("utf-8", errors="replace"))
    # Kept short enough to be publishable whatever came in: a payload near the broker's limit, or bytes
    # that triple once decoded with replacement characters, would make the letter itself unpublishable
    # (and the message it stands for would be redelivered for ever).
    kept = {str(k)[:200]: str(v)[:MAX_DEAD_LETTER_HEADER] for k, v in list((headers or {}).items())[:64]}
    return DeadLetter(
        service=service,
        original_subject=subject[:1000],
        reason=reason[:4000],
        payload=text[:MAX_DEAD_LETTER_PAYLOAD],
        payload_bytes=size,
        truncated=len(text) > MAX_DEAD_LETTER_PAYLOAD,
        headers=kept,
    )


class JetStreamPublisher:
    """The `publish(message, subject, stream, timeout)` of a FastStream broker, over a plain nats-py
    JetStream context (for DeadLetterPublisher in services that do not run a FastStream broker)."""

    def __init__(self, js) -> None:
        self.js = js

    async def publish(self, message: BaseModel, subject: str, stream: str, timeout: float) -> None:
        await self.js.publish(subject, message.model_dump_json().encode(), stream=stream, timeout=timeout)


class DeadLetterPublisher:
    """Publish dead letters of one service on subjects.dead_letter(service) (kept by the DLQ stream).
    Losing a letter is logged, never raised: it must not take the failing handler down with it."""

    def __init__(self, broker, service: str) -> None:
        self.broker = broker
        self.service = service
        self.subject = subjects.dead_letter(service)

    async def send(
        self, original_subject: str, reason: str, payload: bytes | str, headers: Mapping[str, str] | None = None
    ) -> None:
        letter = dead_letter(self.service, original_subject, reason, payload, headers)
        log.warning("dead letter from %s: %s", original_subject, reason)
        try:
            await self.broker.publish(letter, self.subject, stream=subjects.DLQ_STREAM, timeout=5)
        except Exception:
            log.exception("could not publish a dead letter for %s", original_subject)
