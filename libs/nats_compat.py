"""One compatibility fix between nats-py and FastStream, applied where FastStream brokers are made.

nats-py 2.16 (nats.py PR #934) raises a bare `asyncio.TimeoutError` from `PullSubscription.fetch`
when a batch fetch's deadline runs out before its lingering pull is sent; every other timeout of
`fetch` is a `nats.errors.TimeoutError`. FastStream's pull loop (0.7) suppresses only the latter, so an
idle consumer logged an ERROR with a traceback ("Task raised an exception, retrying") every so often
in a normal `make demo`. Here the bare one becomes `nats.errors.TimeoutError` (a subclass of
`asyncio.TimeoutError`, so callers that catch either still do).
"""

from __future__ import annotations

import functools

import nats.errors

_MARK = "_lpx_timeout_compat"


def install() -> None:
    """Idempotent: wrap `PullSubscription.fetch` once per process."""
    from nats.js.client import JetStreamContext

    fetch = JetStreamContext.PullSubscription.fetch
    if getattr(fetch, _MARK, False):
        return

    @functools.wraps(fetch)
    async def fetch_with_nats_timeout(self, *args, **kwargs):
        try:
            return await fetch(self, *args, **kwargs)
        except nats.errors.TimeoutError:
            raise
        except TimeoutError as exc:
            raise nats.errors.TimeoutError from exc

    setattr(fetch_with_nats_timeout, _MARK, True)
    JetStreamContext.PullSubscription.fetch = fetch_with_nats_timeout
