"""Whether a routed request can skip the worker's duplicate lookup before the engine.

Before generating, a worker asks the RESULTS stream whether the request was answered already (a
redelivery, a re-route after a worker was taken for dead, a submission re-dispatched by a second
gateway): one JetStream round trip per request on the way to the first token. A request a gateway
minted for an HTTP call and dispatched once cannot have been answered yet while its first delivery
comes soon after it was sent: the gateway marks that dispatch (`FRESH_REQUEST_HEADER`) and the worker
skips the lookup when every sign agrees.
"""

from __future__ import annotations

import time

from libs.contracts import FRESH_REQUEST_HEADER, InferenceRequest, first_dispatch_id

# A re-route comes only after a worker's heartbeat went stale (10 s by default) and purges what was
# left on that worker's subjects, so an original still waiting for its first delivery while a copy is
# answered elsewhere is not expected at all; the window bounds what this skip trusts even so (a request
# queued longer behind a busy worker is looked up as before). The two clocks are two hosts': the
# margin absorbs their skew.
FRESH_WINDOW_S = 2.0


def skips_duplicate_lookup(msg, request: InferenceRequest, now: float | None = None) -> bool:
    """True when `msg` is the gateway's own first dispatch of a request it minted (the header, and the
    first dispatch's Nats-Msg-Id: copies and re-routes carry another), delivered for the first time,
    within FRESH_WINDOW_S of its sending. Anything unsure: False (the lookup runs)."""
    headers = msg.headers or {}
    if headers.get(FRESH_REQUEST_HEADER) != "1":
        return False
    if headers.get("Nats-Msg-Id") != first_dispatch_id(request.request_id, request.reply_to):
        return False
    try:
        if msg.metadata.num_delivered != 1:
            return False
    except Exception:  # not a JetStream delivery
        return False
    now = time.time() if now is None else now
    return abs(now - request.submitted_at) < FRESH_WINDOW_S  # either clock may run a little ahead
