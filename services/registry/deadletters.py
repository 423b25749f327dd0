"""The registry's dead-letter path: messages it cannot process are kept with the reason on
subjects.dead_letter("registry") (stored by the DLQ stream), never dropped silently."""

from __future__ import annotations

from libs.bus.dead_letters import DeadLetterPublisher

SERVICE = "registry"


class DeadLetters(DeadLetterPublisher):
    def __init__(self, broker) -> None:
        super().__init__(broker, SERVICE)
