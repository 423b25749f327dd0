"""One log line per change of a connection's state (down, then back), however many failures there are in
between: shared by the broker link and every pull loop, so that neither imports the other."""

from __future__ import annotations

import logging
import time

log = logging.getLogger("libs.bus")


class ConnectionState:
    """One log line per change of state, however many failures there are in between."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.down_since: float | None = None

    @property
    def down(self) -> bool:
        return self.down_since is not None

    def failed(self, exc: BaseException | str) -> None:
        if self.down_since is None:
            self.down_since = time.monotonic()
            log.warning("%s unavailable: %s", self.what, describe(exc))

    def ok(self) -> None:
        if self.down_since is not None:
            log.info("%s back after %.1fs", self.what, time.monotonic() - self.down_since)
            self.down_since = None


def describe(exc: BaseException | str) -> str:
    if isinstance(exc, str):
        return exc
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
