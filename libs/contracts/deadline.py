"""The deadline of a NATS request: when its asker stops waiting for the reply.

A responder that gets a request after its deadline skips it: nobody reads that reply, the work would
only lengthen the queue behind it (a responder handles one request at a time), and a reply that late
is refused by the server anyway (`allow_responses` grants one reply for 2 minutes after delivery, and
the refusal is logged as a Publish Violation). The deadline is an absolute wall-clock time in a
header, not in the body, so a request repeated later (the gateway's keep-warm refresh) carries a
fresh one.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping

DEADLINE_HEADER = "Lpx-Deadline"
# Asker and responder read different clocks (NTP keeps them within milliseconds); a request is only
# treated as expired this much past its deadline, so skew never drops a request still awaited.
CLOCK_SKEW_S = 1.0


def deadline_headers(timeout_s: float, now: float | None = None) -> dict[str, str]:
    """Headers for a request whose asker waits `timeout_s` seconds."""
    return {DEADLINE_HEADER: f"{(time.time() if now is None else now) + timeout_s:.3f}"}


def seconds_left(headers: Mapping[str, str] | None, now: float | None = None) -> float | None:
    """How long the asker still waits (negative once it has given up, skew allowance included);
    None when the request names no deadline or an unreadable one (older askers: always answered)."""
    raw = (headers or {}).get(DEADLINE_HEADER)
    if raw is None:
        return None
    try:
        deadline = float(raw)
    except ValueError:
        return None
    if not math.isfinite(deadline):
        return None
    return deadline + CLOCK_SKEW_S - (time.time() if now is None else now)
