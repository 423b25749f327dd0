"""Who may publish and subscribe to what: every service's NATS user and a tenant's connection.

One table, rendered into the server config (`server_config.py`) and into the README's permissions
table, and checked by the integration tests against a real server. A service gets the subjects it
uses and the JetStream API of the streams it uses, per stream: a worker can consume inference work,
publish results and heartbeats, and nothing else (it cannot publish events, read another stream's
messages, or delete a stream). Replies to requests a service answers are allowed by
`allow_responses`, not by publish rights on every inbox.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from libs.contracts import subjects as s

# Accounts: services and tenants share LPX (where the streams live); the auth callout's user lives in
# AUTH (it sees tenants' passwords, nobody else should); the system user (kicks revoked tenants) in SYS.
ACCOUNT = "LPX"
CALLOUT_ACCOUNT = "AUTH"
SYSTEM_ACCOUNT = "SYS"
CALLOUT_SUBJECT = "$SYS.REQ.USER.AUTH"
# A tenant connects as `tenant:<name>`: no service user has a colon, so no tenant name can collide.
TENANT_USER_PREFIX = "tenant:"


@dataclass(frozen=True)
class Role:
    """One service's NATS user and what it may do."""

    user: str
    doc: str
    publish: tuple[str, ...] = ()
    subscribe: tuple[str, ...] = ()
    consume: tuple[str, ...] = ()  # streams it creates consumers on and pulls from
    read: tuple[str, ...] = ()  # streams it reads single messages from (last by subject)
    buckets: tuple[str, ...] = ()  # KV buckets it reads and writes
    purge: tuple[str, ...] = ()  # streams it may purge (by subject filter)
    provision: bool = True  # creates and updates the platform's streams at start (idempotent)
    answers: bool = False  # answers requests (allow_responses)
    account: str = ACCOUNT
    full: bool = False  # the operator's account: everything (lpx CLI, tests, benchmarks)

    @property
    def env_var(self) -> str:
        return "LPX_NATS_PASSWORD_" + self.user.upper().replace("-", "_")

    def publish_allow(self) -> list[str]:
        if self.full:
            return [">"]
        allowed = list(self.publish)
        if self.provision:
            allowed += ["$JS.API.INFO", "$JS.API.STREAM.INFO.*", "$JS.API.STREAM.CREATE.*", "$JS.API.STREAM.UPDATE.*"]
        for stream in self.consume:
            allowed += _consume_api(stream)
        for stream in self.read:
            allowed += _read_api(stream)
        allowed += [f"$JS.API.STREAM.PURGE.{stream}" for stream in self.purge]
        for bucket in self.buckets:
            kv = f"KV_{bucket}"
            allowed += [f"$KV.{bucket}.>", *_consume_api(kv), *_read_api(kv)]
        if self.consume or self.buckets:
            allowed.append("$JS.FC.>")  # flow-control replies of push consumers (KV watchers)
        return _unique(allowed)

    def subscribe_allow(self) -> list[str]:
        if self.full:
            return [">"]
        # Replies (requests it makes, JetStream API answers, publish acks) and push-consumer deliveries.
        return _unique([*self.subscribe, "_INBOX.>"]) if self.account == ACCOUNT else list(self.subscribe)


def _consume_api(stream: str) -> list[str]:
    return [
        f"$JS.API.CONSUMER.CREATE.{stream}",
        f"$JS.API.CONSUMER.CREATE.{stream}.>",
        f"$JS.API.CONSUMER.DURABLE.CREATE.{stream}.>",
        f"$JS.API.CONSUMER.INFO.{stream}.>",
        f"$JS.API.CONSUMER.MSG.NEXT.{stream}.>",
        f"$JS.API.CONSUMER.DELETE.{stream}.>",
        f"$JS.ACK.{stream}.>",
    ]


def _read_api(stream: str) -> list[str]:
    return [f"$JS.API.STREAM.MSG.GET.{stream}", f"$JS.API.DIRECT.GET.{stream}", f"$JS.API.DIRECT.GET.{stream}.>"]


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


GATEWAY = Role(
    "gateway",
    "routes work to workers, relays results and token deltas, takes tenants' async submissions",
    publish=(s.INFER_ALL, s.RESULTS_ALL, s.TOKENS_ALL, s.GATEWAY_LIMITS_ALL, s.RESOLVE, s.AUTH, s.DLQ_ALL),
    # Its own results and token deltas arrive under lpx.{results,tokens}.gw.<gateway>.
    subscribe=(
        "lpx.results.gw.>",
        "lpx.tokens.gw.>",
        s.WORKER_LOAD_ALL,
        s.GATEWAY_LIMITS_ALL,
        s.TENANT_EVENTS,
        s.ADAPTER_EVENTS,
    ),
    consume=(s.SUBMIT_STREAM, s.INFER_STREAM),  # INFER: it retires a dead worker's durable
    read=(s.RESULTS_STREAM,),
    buckets=(s.HEARTBEAT_BUCKET, s.ADAPTER_DEMAND_BUCKET),  # demand: what the workers pre-load
    purge=(s.INFER_STREAM,),  # a dead worker's backlog, once re-routed
)
WORKER = Role(
    "worker",
    "consumes its pool's inference work, publishes results, token deltas, load and heartbeats",
    # INFER: drain hand-offs, and work passed on over the pool's load bound
    publish=(s.RESULTS_ALL, s.TOKENS_ALL, s.WORKER_LOAD_ALL, s.INFER_ALL, s.DLQ_ALL),
    # Activations: the owner of a new version fetches it before its first request. Load: the others'
    # in-flight counts, for the pool's load bound (no tenant data in them).
    subscribe=("lpx.control.>", s.adapter_event("activated"), s.WORKER_LOAD_ALL),
    # The active adapter set: watched, not written (an ordered consumer on its stream).
    consume=(s.INFER_STREAM, f"KV_{s.ACTIVE_ADAPTERS_BUCKET}"),
    read=(s.RESULTS_STREAM,),
    buckets=(s.HEARTBEAT_BUCKET, s.ADAPTER_DEMAND_BUCKET),
)
REGISTRY = Role(
    "registry",
    "answers resolve/auth/eval-context requests, publishes lifecycle events, meters usage from results",
    publish=(s.EVENTS_ALL, s.DLQ_ALL, s.TRAIN_JOBS),
    subscribe=(s.RESOLVE, s.AUTH, s.EVAL_CONTEXT),
    consume=(s.EVENTS_STREAM, s.RESULTS_STREAM),
    buckets=(s.ACTIVE_ADAPTERS_BUCKET,),  # every active version, for the workers' placement
    answers=True,
)
EVAL_GATE = Role(
    "eval-gate",
    "consumes 'registered' events, publishes verdicts",
    publish=(s.EVALUATED, s.DLQ_ALL, s.EVAL_CONTEXT),
    consume=(s.EVENTS_STREAM,),
    buckets=(s.EVAL_LEDGER_BUCKET,),
)
TRAINER = Role(
    "trainer",
    "consumes training jobs and migrations, publishes progress",
    publish=(s.TRAIN_PROGRESS_ALL, s.DLQ_ALL),
    consume=(s.TRAIN_STREAM,),
    buckets=(s.TRAIN_LEDGER_BUCKET,),
)
ADMIN = Role("admin", "the operator: the lpx CLI (stack, top, train), tests and benchmarks; everything", full=True)
CALLOUT = Role(
    "callout",
    "the registry's auth callout: answers the server's questions about tenant connections",
    subscribe=(CALLOUT_SUBJECT,),
    provision=False,
    answers=True,
    account=CALLOUT_ACCOUNT,
)
SYSTEM = Role(
    "system",
    "the registry's system-account user: finds and disconnects a revoked credential's connections",
    publish=("$SYS.REQ.SERVER.PING.CONNZ", "$SYS.REQ.SERVER.*.KICK"),
    subscribe=("_INBOX.>",),
    provision=False,
    account=SYSTEM_ACCOUNT,
)

SERVICE_ROLES: tuple[Role, ...] = (GATEWAY, WORKER, REGISTRY, EVAL_GATE, TRAINER)
ROLES: tuple[Role, ...] = (*SERVICE_ROLES, ADMIN, CALLOUT, SYSTEM)
BY_USER = {role.user: role for role in ROLES}


@dataclass(frozen=True)
class TenantPermissions:
    publish: list[str] = field(default_factory=list)
    subscribe: list[str] = field(default_factory=list)


def tenant_permissions(tenant: str) -> TenantPermissions:
    """A tenant's connection: submit its own work, read its own results and token deltas (live, and
    stored ones by a direct get scoped to its subjects), receive replies in its own inbox."""
    results = s.tenant_results_filter(tenant)
    return TenantPermissions(
        publish=[s.submit(tenant), s.direct_get_last(s.RESULTS_STREAM, results)],
        subscribe=[results, s.tenant_tokens_filter(tenant), s.tenant_inbox_prefix(tenant) + ".>"],
    )


def markdown_table() -> str:
    """The README's permissions table (tests/unit/test_nats_authorization.py keeps the README's copy equal)."""
    rows = ["| user | account | for | may publish / use | may subscribe |", "|---|---|---|---|---|"]
    for role in ROLES:
        if role.full:
            rows.append(f"| `{role.user}` | {role.account} | {role.doc} | everything | everything |")
            continue
        uses = [
            f"{verb} {', '.join(names)}"
            for verb, names in (
                ("consume", role.consume),
                ("read", role.read),
                ("KV", role.buckets),
                ("purge", role.purge),
            )
            if names
        ]
        uses += ["provisioning"] if role.provision else []
        uses += ["replies (allow_responses)"] if role.answers else []
        publish = "; ".join([_codes(role.publish), *uses])
        rows.append(f"| `{role.user}` | {role.account} | {role.doc} | {publish} | {_codes(role.subscribe)} |")
    tenant = tenant_permissions("TENANT")
    rows.append(
        f"| `tenant:TENANT` | {ACCOUNT} | a tenant's async client, through the auth callout | "
        f"{_codes(tenant.publish)} | {_codes(tenant.subscribe)} |"
    )
    return "\n".join(rows) + "\n"


def _codes(items) -> str:
    return ", ".join(f"`{item}`" for item in items) or "-"
