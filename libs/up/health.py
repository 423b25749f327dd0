"""Is a service of the local platform healthy: supervisord's state, then its own check (an HTTP
endpoint that answers 200, or a worker's heartbeat in the broker's bucket); and is a port free."""

from __future__ import annotations

import asyncio
import socket

import httpx

from libs.up.plan import ServiceSpec
from libs.up.supervisor import RUNNING


def service_health(specs: list[ServiceSpec], infos: dict) -> dict[str, bool]:
    """Each service's health: running under supervisord, and its check (`http:PATH` answers 200,
    `heartbeat:ID` has a live heartbeat) passing."""
    result = {}
    beats = [spec.health.split(":", 1)[1] for spec in specs if spec.health.startswith("heartbeat:")]
    alive_workers = heartbeats(beats) if beats else set()
    for spec in specs:
        info = infos.get(spec.name)
        if info is None or info.state != RUNNING:
            result[spec.name] = False
        elif spec.health.startswith("http:"):
            result[spec.name] = http_ok(f"http://127.0.0.1:{spec.port}{spec.health[5:]}")
        elif spec.health.startswith("heartbeat:"):
            result[spec.name] = spec.health.split(":", 1)[1] in alive_workers
        else:
            result[spec.name] = True
    return result


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def http_ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def heartbeats(worker_ids: list[str]) -> set[str]:
    """The workers among `worker_ids` with a live heartbeat (one NATS connection for all of them)."""
    import nats

    from libs.contracts import subjects
    from libs.settings import ConnectionSettings

    async def read() -> set[str]:
        try:
            conn = ConnectionSettings.load()
            nc = await nats.connect(
                conn.nats_servers, connect_timeout=2, max_reconnect_attempts=0, **conn.nats_auth("admin")
            )
        except Exception:
            return set()
        try:
            kv = await nc.jetstream().key_value(subjects.HEARTBEAT_BUCKET)
            alive = set()
            for worker_id in worker_ids:
                try:
                    await kv.get(worker_id)
                    alive.add(worker_id)
                except Exception:
                    pass
            return alive
        except Exception:
            return set()
        finally:
            await nc.close()

    return asyncio.run(read())
