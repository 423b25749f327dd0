"""Where a request's time went, stage by stage, from the gateway's own stamps and the worker's.

Stages, in order (each the time between two stamps, unix seconds):
  gateway_in      accepted by the HTTP handler -> publish started (auth, adapter resolve, routing)
  publish         publish started -> JetStream acknowledged it
  to_worker       acknowledged -> the worker fetched it (pull loop, worker capacity)
  worker_prepare  fetched -> handed to the engine (duplicate check, adapter tier, slot wait)
  prefill         handed to the engine -> first token
  decode          first token -> last token
  worker_out      last token -> result about to be published
  to_gateway      result published -> the gateway has it
  reply           the gateway has it -> the reply is sent
`to_worker` and `to_gateway` span two hosts and carry their clock skew (clamped at 0); on one host they
are exact. Everything but prefill and decode is what loraplex adds around the engine.
"""

from __future__ import annotations

from libs.contracts import InferenceResult

STAGES = (
    "gateway_in",
    "publish",
    "to_worker",
    "worker_prepare",
    "prefill",
    "decode",
    "worker_out",
    "to_gateway",
    "reply",
)
ENGINE_STAGES = ("prefill", "decode")


def stages(
    *,
    accepted_at: float,
    publish_started_at: float | None,
    published_at: float | None,
    result: InferenceResult,
    received_at: float | None,
    replied_at: float,
) -> dict[str, float]:
    """Stage -> seconds, for the stages whose two stamps are known (a re-routed or failed request may
    lack some)."""
    t = result.timings
    stamps = [
        accepted_at,
        publish_started_at,
        published_at,
        t.fetched_at,
        t.engine_added_at,
        t.first_token_at,
        t.last_token_at,
        t.result_sent_at,
        received_at,
        replied_at,
    ]
    out = {}
    for name, start, end in zip(STAGES, stamps[:-1], stamps[1:], strict=True):
        if start is not None and end is not None:
            out[name] = max(0.0, end - start)
    return out
