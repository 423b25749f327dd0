"""Tenants' NATS connections: the server's auth callout answered from the registry's credentials, and
revocation that disconnects at once.

A tenant connects as `tenant:<name>` with its NATS credential as password. nats-server sends every
connection that is not a service user to `$SYS.REQ.USER.AUTH` (the AUTH account) and waits for a
signed answer. This responder checks the credential against its hash in PostgreSQL and answers with a
user JWT that carries the tenant's permissions (libs/natsauth/permissions.py: its own submission
subject, its own results and token deltas, its own inbox) or with an error, which the server turns
into an authorization violation.

Revoking a credential refuses its next connection here; `disconnect` also finds the connections it
has open on every server of the cluster (CONNZ through the system account) and kicks them, so a
revoked credential is cut off within a second, not when its session expires.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time

import nats

from libs.bus.link import quiet_callbacks
from libs.natsauth import jwt, permissions
from services.registry import tenants
from services.registry.db import transaction
from services.registry.errors import Unauthorized

log = logging.getLogger(__name__)
QUEUE = "lpx-registry-callout"
CONNZ_WAIT_S = 0.3  # how long the servers of a cluster get to answer a CONNZ ping


def connection_name(tenant: str, key_id: str) -> str:
    """The name a tenant connection carries on the server (CONNZ `user` filter finds it by this)."""
    return f"{permissions.TENANT_USER_PREFIX}{tenant}:{key_id}"


class NatsAccess:
    def __init__(self, ctx) -> None:
        self.ctx = ctx
        settings = ctx.settings
        self.connections = settings.connections
        seed = settings.nats_callout_seed.get_secret_value() if settings.nats_callout_seed else None
        self.issuer = jwt.keypair(seed) if seed else None
        self.session_s = settings.nats_tenant_session_s
        self.callout_nc = None
        self.system_nc = None
        self.answered = {"allowed": 0, "refused": 0}
        self._answering: set[asyncio.Task] = set()

    @property
    def enabled(self) -> bool:
        return self.issuer is not None

    async def start(self) -> None:
        if not self.enabled:
            log.warning("no LPX_REGISTRY_NATS_CALLOUT_SEED: tenants cannot connect to NATS (async submission)")
            return
        self.callout_nc = await self._connect(permissions.CALLOUT.user)
        await self.callout_nc.subscribe(permissions.CALLOUT_SUBJECT, queue=QUEUE, cb=self._answer_soon)
        self.system_nc = await self._connect(permissions.SYSTEM.user)
        log.info("answering NATS auth callout for tenant connections")

    async def _connect(self, role: str):
        return await nats.connect(
            servers=self.connections.nats_servers,
            name=f"lpx-registry-{role}",
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.5,
            **self.connections.nats_auth(role),
            **quiet_callbacks(f"NATS ({role})"),
        )

    async def stop(self) -> None:
        for nc in (self.callout_nc, self.system_nc):
            if nc is not None:
                with contextlib.suppress(Exception):
                    await nc.drain()

    # --- the callout -----------------------------------------------------------------------------
    async def _answer_soon(self, msg) -> None:
        """nats-py runs one callback at a time per subscription: each question gets its own task, so a
        burst of tenant connects does not wait in line behind each other's database lookups."""
        task = asyncio.create_task(self._answer(msg))
        self._answering.add(task)
        task.add_done_callback(self._answering.discard)

    async def _answer(self, msg) -> None:
        try:
            request = jwt.decode(msg.data.decode(), verify=True)["nats"]
        except (jwt.JwtError, KeyError, UnicodeDecodeError) as exc:
            log.warning("ignored a malformed auth callout request: %s", exc)
            return
        server_id, user_nkey = request["server_id"]["id"], request["user_nkey"]
        opts = request.get("connect_opts", {})
        try:
            tenant, key_id = await self._check(opts.get("user", ""), opts.get("pass", ""))
            answer = {"jwt": self._user_jwt(user_nkey, tenant, key_id)}
            self.answered["allowed"] += 1
            log.info("NATS connection allowed", extra={"tenant": tenant, "key_id": key_id})
        except Unauthorized as exc:
            answer = {"error": exc.message}
            self.answered["refused"] += 1
            log.warning("NATS connection refused: %s", exc.message, extra={"user": opts.get("user", "")[:80]})
        except Exception as exc:
            answer = {"error": "the registry cannot check credentials right now"}
            log.warning("NATS connection refused: credentials unavailable (%s)", type(exc).__name__)
        claims = {
            "sub": user_nkey,
            "aud": server_id,
            "nats": {**answer, "type": "authorization_response", "version": 2},
        }
        await msg.respond(jwt.encode(claims, self.issuer).encode())

    async def _check(self, user: str, credential: str) -> tuple[str, str]:
        if not user.startswith(permissions.TENANT_USER_PREFIX):
            raise Unauthorized("unknown NATS user (tenants connect as tenant:<name> with a NATS credential)")
        tenant_name = user.removeprefix(permissions.TENANT_USER_PREFIX)
        async with transaction(self.ctx.sessions) as session:
            await tenants.authenticate_nats(session, tenant_name, credential)
        return tenant_name, credential.split("_")[2]

    def _user_jwt(self, user_nkey: str, tenant: str, key_id: str) -> str:
        allowed = permissions.tenant_permissions(tenant)
        claims = {
            "sub": user_nkey,
            "aud": permissions.ACCOUNT,  # placement: the account the platform's streams live in
            "name": connection_name(tenant, key_id),
            "exp": int(time.time()) + self.session_s,
            "nats": {
                "pub": {"allow": allowed.publish},
                "sub": {"allow": allowed.subscribe},
                "subs": -1,
                "data": -1,
                "payload": -1,
                "type": "user",
                "version": 2,
            },
        }
        return jwt.encode(claims, self.issuer)

    # --- revocation ------------------------------------------------------------------------------
    async def disconnect(self, tenant: str, key_id: str) -> int:
        """Kick every connection of this credential on every server; the number kicked. Best effort:
        with the broker away the kick fails, and the credential is refused at its next connect."""
        if self.system_nc is None or not self.system_nc.is_connected:
            return 0
        found = await self._connz(connection_name(tenant, key_id))
        kicked = 0
        for server_id, cid in found:
            with contextlib.suppress(Exception):
                await self.system_nc.request(
                    f"$SYS.REQ.SERVER.{server_id}.KICK", json.dumps({"cid": cid}).encode(), timeout=1.0
                )
                kicked += 1
        log.info("revoked NATS credential disconnected", extra={"tenant": tenant, "key_id": key_id, "kicked": kicked})
        return kicked

    async def _connz(self, name: str) -> list[tuple[str, int]]:
        """(server id, client id) of every connection named `name`, from every server that answers."""
        nc = self.system_nc
        inbox = nc.new_inbox()
        replies: list[dict] = []

        async def collect(msg) -> None:
            with contextlib.suppress(ValueError):
                replies.append(json.loads(msg.data))

        sub = await nc.subscribe(inbox, cb=collect)
        try:
            filters = {"user": name, "acc": permissions.ACCOUNT, "limit": 1024}
            await nc.publish("$SYS.REQ.SERVER.PING.CONNZ", json.dumps(filters).encode(), reply=inbox)
            await asyncio.sleep(CONNZ_WAIT_S)
        finally:
            await sub.unsubscribe()
        return [(r["server"]["id"], c["cid"]) for r in replies for c in (r.get("data") or {}).get("connections") or []]
