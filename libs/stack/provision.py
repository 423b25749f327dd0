"""JetStream provisioning of a freshly started stack: every stream of libs/contracts/subjects.py, as
the operator's user, replicated over the cluster's nodes (R3 at most)."""

from __future__ import annotations

import asyncio
import threading
import time

from libs.contracts.subjects import STREAMS
from libs.stack.nats_server import admin_auth
from libs.stack.server import StackError


def provision_streams(urls: str, nats_nodes: int, secrets: dict[str, str], timeout_s: float) -> None:
    """Create or update the streams; a cluster is retried until it has elected a meta leader."""
    from libs.bus.provision import ensure_streams

    # A thread of its own, so `up` also works when called from inside a running event loop.
    failure: list[BaseException] = []

    replicas = min(nats_nodes, 3)

    async def until_ready() -> None:
        # A cluster answers JetStream requests only once it has elected a meta leader.
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                await ensure_streams(urls, STREAMS, replicas=replicas, auth=admin_auth(secrets))
                return
            except Exception:
                if time.monotonic() > deadline or nats_nodes == 1:
                    raise
                await asyncio.sleep(0.5)

    def provision() -> None:
        try:
            asyncio.run(until_ready())
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=provision, name="lpx-stack-streams")
    thread.start()
    thread.join()
    if failure:
        raise StackError(f"could not provision JetStream streams: {failure[0]}") from failure[0]
