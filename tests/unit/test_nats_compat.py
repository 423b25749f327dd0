"""nats-py's bare asyncio.TimeoutError from a batch fetch reaches FastStream as nats.errors.TimeoutError."""

import nats.errors
import pytest
from nats.js.client import JetStreamContext

from libs import nats_compat


async def test_a_bare_timeout_from_a_batch_fetch_becomes_a_nats_timeout(monkeypatch):
    async def expired(self, batch, expires, timeout, heartbeat=None):
        raise TimeoutError  # what nats-py 2.16's _fetch_n raises when its deadline ran out

    monkeypatch.setattr(JetStreamContext.PullSubscription, "fetch", JetStreamContext.PullSubscription.fetch)
    monkeypatch.setattr(JetStreamContext.PullSubscription, "_fetch_n", expired)
    nats_compat.install()
    nats_compat.install()  # idempotent: wrapped once
    sub = JetStreamContext.PullSubscription.__new__(JetStreamContext.PullSubscription)
    sub._sub = object()
    with pytest.raises(nats.errors.TimeoutError):
        await sub.fetch(batch=4, timeout=0.1)
    assert JetStreamContext.PullSubscription.fetch.__wrapped__.__name__ == "fetch"  # not wrapped twice
