"""Every service's NATS subjects fed with malformed and adversarial messages (hypothesis): random bytes,
JSON of the wrong shape, a valid message with one field broken (wrong schema_version, wrong types,
missing fields), huge payloads, odd headers. Each message is accounted for: dead-lettered with a
reason, or answered (an error result / an error reply); the JetStream consumers end with nothing
pending (nothing lost, nothing stuck in redelivery); and the services keep serving afterwards.

On the live platform of this package: the gateway (async submissions), a simulated worker (routed
work), the registry (usage metering from results; auth and resolve request/reply).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import Counter
from collections.abc import Callable

import httpx
import nats
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from libs.bus.retry import last_message
from libs.contracts import DeadLetter, ResolveReply, TenantAuthReply, subjects
from tests.integration.fuzz.conftest import WORKER

pytestmark = pytest.mark.integration
MARK = "Lpx-Fuzz-Id"
EXAMPLES = 40

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=40))
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=16,
)
header_names = st.from_regex(r"[A-Za-z][A-Za-z0-9-]{0,20}", fullmatch=True).filter(
    lambda name: not name.lower().startswith("nats") and name.lower() != MARK.lower()
)
header_values = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E, exclude_characters=":"), max_size=40)
headers = st.dictionaries(header_names, header_values, max_size=3)


def broken(valid: dict) -> st.SearchStrategy[dict]:
    """`valid` with one field replaced by something of the wrong kind, or removed, or the schema
    version of another contract."""
    field = st.sampled_from(sorted(valid))
    replace = st.tuples(field, json_values).map(lambda fv: {**valid, fv[0]: fv[1]})
    drop = field.map(lambda f: {k: v for k, v in valid.items() if k != f})
    version = st.sampled_from([0, 2, "1", None, 1.5]).map(lambda v: {**valid, "schema_version": v})
    return st.one_of(replace, drop, version)


def payloads(valid: Callable[[], dict]) -> st.SearchStrategy[bytes]:
    huge = st.sampled_from(
        [
            b"x" * 1_000_000,  # near the broker's 1 MiB limit
            bytes(range(128, 256)) * 4_000,  # 512 KB that is not UTF-8: 1.5 MB once decoded with replacements
            json.dumps({**valid(), "junk": "y" * 800_000}).encode(),
        ]
    )
    return st.one_of(
        st.binary(max_size=2_000),
        json_values.map(lambda v: json.dumps(v).encode()),
        st.builds(valid).flatmap(broken).map(lambda d: json.dumps(d).encode()),
        huge,
    )


class Watch:
    """Dead letters by service, and the fuzz id each carried in its headers."""

    def __init__(self) -> None:
        self.letters: dict[str, DeadLetter] = {}

    async def on_letter(self, msg) -> None:
        letter = DeadLetter.model_validate_json(msg.data)
        if MARK in letter.headers:
            self.letters[letter.headers[MARK]] = letter


@pytest.fixture
async def bus(platform):
    nc = await nats.connect(platform.registry.settings.connections.nats_url)
    watch = Watch()
    sub = await nc.subscribe(subjects.DLQ_ALL, cb=watch.on_letter)
    yield nc, nc.jetstream(), watch
    await sub.unsubscribe()
    await nc.drain()


async def until(predicate, timeout_s: float) -> bool:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while asyncio.get_running_loop().time() < deadline:
        if await predicate():
            return True
        await asyncio.sleep(0.05)
    return False


def run_examples(loop, strategy, check) -> None:
    """Hypothesis in a thread (its engine is synchronous); each example checked on the test's loop,
    where the in-process registry answers."""

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(strategy)
    def one(example) -> None:
        asyncio.run_coroutine_threadsafe(check(*example), loop).result(timeout=60)

    one()


async def feed(js, watch: Watch, subject: str, strategy, service: str, valid: Callable[[], dict]) -> Counter:
    """Publish each example to `subject`; each must be dead-lettered by `service` with a reason, or
    answered (a result under its request id) within seconds. The outcomes, counted. One valid message
    goes first and must be answered: the answered path is exercised whatever the examples are (under
    CI, Hypothesis draws a fixed sequence that may hold no acceptable payload)."""
    outcomes: Counter = Counter()
    first = valid()
    await js.publish(subject, json.dumps(first).encode(), headers={"Nats-Msg-Id": uuid.uuid4().hex})
    assert await until(lambda: answered(js, first["request_id"]), 20), "a valid message was not answered"
    outcomes["answered"] += 1

    async def check(payload: bytes, extra: dict) -> None:
        mark = uuid.uuid4().hex
        await js.publish(subject, payload, headers={**extra, MARK: mark, "Nats-Msg-Id": mark})
        rid = _request_id(payload)

        async def accounted() -> bool:
            if mark in watch.letters:
                assert watch.letters[mark].service == service and watch.letters[mark].reason
                outcomes["dead-lettered"] += 1
                return True
            if rid is not None and await answered(js, rid):
                outcomes["answered"] += 1
                return True
            return False

        assert await until(accounted, 10), f"neither dead-lettered nor answered: {payload[:200]!r}"

    await asyncio.to_thread(run_examples, asyncio.get_running_loop(), st.tuples(strategy, headers), check)
    return outcomes


async def still_serving(platform) -> None:
    body = {"model": "smollm2-135m", "messages": [{"role": "user", "content": "still there?"}], "max_tokens": 4}
    async with httpx.AsyncClient(base_url=platform.url, timeout=30) as http:
        reply = await http.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {platform.key}"})
    assert reply.status_code == 200, reply.text


async def nothing_pending(js, stream: str, durable_prefix: str) -> None:
    async def drained() -> bool:
        names = [c.name for c in await js.consumers_info(stream) if c.name.startswith(durable_prefix)]
        infos = [await js.consumer_info(stream, name) for name in names]
        return bool(infos) and all(i.num_pending == 0 and i.num_ack_pending == 0 for i in infos)

    assert await until(drained, 30), f"messages left pending on {stream} ({durable_prefix}*)"


async def test_malformed_submissions_are_dead_lettered_or_answered_and_the_gateway_keeps_serving(platform, bus):
    nc, js, watch = bus

    def valid() -> dict:
        return {
            "schema_version": 1,
            "request_id": uuid.uuid4().hex,
            "api_key": platform.key,
            "model": "smollm2-135m",
            "messages": [{"role": "user", "content": "hi"}],
            "sampling": {"max_tokens": 4},
        }

    from libs.client import tenant_of

    outcomes = await feed(js, watch, subjects.submit(tenant_of(platform.key)), payloads(valid), "gateway", valid)
    print(f"submissions: {dict(outcomes)}")
    assert outcomes["dead-lettered"] and outcomes["answered"], outcomes  # both paths were exercised
    await nothing_pending(js, subjects.SUBMIT_STREAM, "gateway-submit")
    await still_serving(platform)


async def test_malformed_routed_work_is_dead_lettered_or_answered_and_the_worker_keeps_serving(platform, bus):
    nc, js, watch = bus
    subject = subjects.infer(platform.pool, WORKER, "base")

    def valid() -> dict:
        return {
            "schema_version": 1,
            "request_id": uuid.uuid4().hex,
            "tenant_id": platform.tenant,
            "base_model": "smollm2-135m",
            "prompt": "hi",
            "sampling": {"max_tokens": 4},
        }

    outcomes = await feed(js, watch, subject, payloads(valid), "worker", valid)
    print(f"routed work: {dict(outcomes)}")
    assert outcomes["dead-lettered"] and outcomes["answered"], outcomes
    await nothing_pending(js, subjects.INFER_STREAM, subjects.worker_durable(platform.pool, WORKER))
    await still_serving(platform)


async def test_malformed_results_are_dead_lettered_by_usage_metering(platform, bus):
    nc, js, watch = bus
    garbage = st.one_of(
        st.binary(min_size=1, max_size=2_000).filter(lambda b: not _is_object(b)),
        json_values.filter(lambda v: not isinstance(v, dict) or "request_id" not in v).map(
            lambda v: json.dumps(v).encode()
        ),
    )

    async def check(payload: bytes, extra: dict) -> None:
        mark = uuid.uuid4().hex
        await js.publish(subjects.results(f"fuzz-{mark}"), payload, headers={**extra, MARK: mark, "Nats-Msg-Id": mark})

        async def accounted() -> bool:
            letter = watch.letters.get(mark)
            return letter is not None and letter.service == "registry" and "usage" in letter.reason

        assert await until(accounted, 20), f"a malformed result was not dead-lettered: {payload[:200]!r}"

    await asyncio.to_thread(run_examples, asyncio.get_running_loop(), st.tuples(garbage, headers), check)
    assert (await platform.registry.client.get("/readyz")).status_code == 200


@pytest.mark.parametrize("subject, reply_model", [(subjects.AUTH, TenantAuthReply), (subjects.RESOLVE, ResolveReply)])
async def test_malformed_requests_to_the_registry_get_a_refusal_not_silence(platform, bus, subject, reply_model):
    nc, js, watch = bus

    async def check(payload: bytes, extra: dict) -> None:
        reply = reply_model.model_validate_json((await nc.request(subject, payload, timeout=10, headers=extra)).data)
        refused = not reply.ok if isinstance(reply, TenantAuthReply) else not reply.found
        assert refused and reply.code, reply

    strategy = st.tuples(
        st.one_of(st.binary(max_size=2_000), json_values.map(lambda v: json.dumps(v).encode())), headers
    )
    await asyncio.to_thread(run_examples, asyncio.get_running_loop(), strategy, check)
    await still_serving(platform)


async def answered(js, rid: str) -> bool:
    """A result under `rid`: a worker's (no gateway named) or a submission's (any tenant's subject)."""
    for subject in (subjects.results(rid), f"{subjects.PREFIX}.results.t.*.{rid}"):
        if await last_message(js, subjects.RESULTS_STREAM, subject) is not None:
            return True
    return False


def _request_id(payload: bytes) -> str | None:
    try:
        rid = json.loads(payload).get("request_id")
        return subjects.token(rid) if isinstance(rid, str) and len(rid) <= 100 else None
    except Exception:
        return None


def _is_object(payload: bytes) -> bool:
    try:
        return isinstance(json.loads(payload), dict)
    except Exception:
        return False
