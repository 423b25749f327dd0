"""The registry's dead-letter path: messages it cannot process are kept with the reason on
subjects.dead_letter("registry") (stored by the DLQ stream), never dropped silently."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from libs.contracts import subjects
from libs.messaging import dead_letter

log = logging.getLogger(__name__)
SERVICE = "registry"


class DeadLetters:
    def __init__(self, broker) -> None:
        self.broker = broker
        self.subject = subjects.dead_letter(SERVICE)

    async def send(self, original_subject: str, reason: str, payload: bytes | str,
                   headers: Mapping[str, str] | None = None) -> None:  # fmt: skip
        letter = dead_letter(SERVICE, original_subject, reason, payload, headers)
        log.warning("dead letter from %s: %s", original_subject, reason)
        try:
            await self.broker.publish(letter, self.subject, stream=subjects.DLQ_STREAM, timeout=5)
        except Exception:  # noqa: BLE001 - losing the letter must not take the handler down with it
            log.exception("could not publish a dead letter for %s", original_subject)
