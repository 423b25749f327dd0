"""A drained worker (its heartbeat key deleted) is told apart from a lost one, whichever way nats-py
reports the delete marker."""

from types import SimpleNamespace

import pytest
from nats.js.errors import KeyDeletedError, KeyNotFoundError

from services.gateway.reroute import Rerouter


def rerouter_over(error: Exception | None) -> Rerouter:
    async def get(key):
        if error is not None:
            raise error
        return SimpleNamespace(value=b"{}")

    pools = SimpleNamespace(_kv=SimpleNamespace(get=get))
    return Rerouter(SimpleNamespace(pools=pools))


@pytest.mark.parametrize(
    ("error", "drained"),
    [
        (KeyNotFoundError(None, "DEL"), True),  # nats-py 2.16: the delete marker, as KeyNotFoundError
        (KeyNotFoundError(None, "PURGE"), True),
        (KeyDeletedError(None, "DEL"), True),  # older nats-py
        (KeyNotFoundError(), False),  # expired (TTL) or never written: lost
        (None, False),  # still there but stale: lost
        (TimeoutError(), False),
    ],
)
async def test_a_deleted_heartbeat_means_drained(error, drained):
    assert await rerouter_over(error)._left_cleanly("w-1") is drained
