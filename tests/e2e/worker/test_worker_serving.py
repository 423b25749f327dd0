"""The worker with a real vLLM engine, real NATS JetStream and a real S3 store."""

from __future__ import annotations

import asyncio
import io

import pytest

from libs.contracts import AdapterRef, AdapterTier, DeadLetter, subjects
from tests.e2e.worker.conftest import POOL, UploadedAdapter, upload

pytestmark = pytest.mark.e2e

Q1, Q2 = "Where is my order?", "Can you help me with my account?"


async def test_adapters_and_base_in_one_batch_each_get_their_own_output(make_worker, client, tones, base_model_path):
    from libs.lora.train import peft_generate

    await make_worker("w-mix")
    plan = [
        (name, adapter, q)
        for q in (Q1, Q2)
        for name, adapter in (("pirate", tones["pirate"]), ("formal", tones["formal"]), ("base", None))
    ]
    rids = await asyncio.gather(*(client.send("w-mix", adapter, q, max_tokens=24) for _, adapter, q in plan))
    results = await client.wait(rids)
    for (name, adapter, _q), rid in zip(plan, rids, strict=True):
        result = results[rid]
        assert result.ok, result.error
        if name == "pirate":
            assert "Ahoy" in result.text, result.text
        elif name == "formal":
            assert "Dear valued customer" in result.text, result.text
        else:
            assert "Ahoy" not in result.text and "valued customer" not in result.text
        assert result.adapter_digest_applied == (adapter.ref.digest if adapter else None)
        assert (result.adapter_tier == AdapterTier.NONE) == (adapter is None)
    # A base request batched with adapter requests gets exactly what it gets alone (vLLM-CPU's torch
    # LoRA ops applied the last adapter slot to base rows; libs/engine/vllm_patches.py fixes that).
    solo = await client.send("w-mix", None, Q1, max_tokens=24)
    base_rid = next(rid for (name, _a, q), rid in zip(plan, rids, strict=True) if name == "base" and q == Q1)
    assert results[base_rid].text == (await client.wait([solo]))[solo].text
    # Parity: vLLM's greedy output with the adapter equals transformers + peft, token for token.
    rid = rids[0]
    reference = peft_generate(base_model_path, tones["pirate"].path, [{"role": "user", "content": Q1}], 24)
    assert results[rid].text.strip() == reference.strip()


async def _solo_outputs(client, worker_id, adapters, question):
    outputs = {}
    for adapter in adapters:
        rid = await client.send(worker_id, adapter, question, max_tokens=16)
        outputs[adapter.name] = (await client.wait([rid]))[rid].text
    return outputs


async def test_more_adapters_than_slots_and_eviction_churn_keep_outputs(make_worker, client, noise):
    assert len(noise) > 4  # more than max_loras (2) and max_cpu_loras (4) of the session engine
    await make_worker("w-solo")
    solo = await _solo_outputs(client, "w-solo", noise, Q1)
    assert len(set(solo.values())) == len(noise), "noise adapters should produce distinct outputs"

    size = noise[0].ref.size_bytes
    churn = await make_worker("w-churn", disk_cache_bytes=int(size * 1.5))  # room for one adapter only
    for _round in range(2):
        rids = await asyncio.gather(*(client.send("w-churn", a, Q1, max_tokens=16) for a in noise))
        results = await client.wait(rids)
        for adapter, rid in zip(noise, rids, strict=True):
            assert results[rid].ok, results[rid].error
            assert results[rid].text == solo[adapter.name]
            assert results[rid].adapter_digest_applied == adapter.ref.digest
    assert churn.tiers.disk.stats.evictions >= len(noise)
    assert churn.tiers.disk.stats.downloads > len(noise)  # evicted adapters were fetched again


async def test_a_flood_over_more_adapters_than_slots_is_admitted_grouped(make_worker, client, noise):
    """Adapter-aware admission: 5 adapters x 3 requests and 3 base requests at once on 2 slots. Each adapter
    takes a slot for its whole group, base requests never wait, outputs are what each request gets alone."""
    await make_worker("w-alone")
    alone = await _solo_outputs(client, "w-alone", noise, Q1)
    base_rid = await client.send("w-alone", None, Q1, max_tokens=16)
    base_alone = (await client.wait([base_rid]))[base_rid].text
    worker = await make_worker("w-group", capacity=18, max_adapter_wait_s=30, admission="grouped")
    plan = [adapter for _ in range(3) for adapter in [*noise, None]]  # interleaved: the worst order for slots
    rids = await asyncio.gather(*(client.send("w-group", adapter, Q1, max_tokens=16) for adapter in plan))
    results = await client.wait(rids)
    for adapter, rid in zip(plan, rids, strict=True):
        result = results[rid]
        assert result.ok, result.error
        assert result.text == (alone[adapter.name] if adapter else base_alone)
        if adapter is None:
            assert result.timings.admission_wait_s == 0.0  # the base model needs no slot
    stats = worker.admission.stats
    assert stats.admitted == 15
    assert stats.slot_swaps <= 2 * len(noise), stats  # grouped: not one swap per request (15)
    assert stats.longest_wait_s > 0  # some adapters did wait for a slot


async def test_a_flood_over_more_adapters_than_slots_queues_in_the_engine(make_worker, client, noise):
    """The default admission: the same flood goes to the engine at once (vLLM's scheduler queues it for
    its 2 slots). With a 1 ms bound the starvation guard engages on nearly every arrival: every request
    is still answered, each with what it gets alone."""
    await make_worker("w-solo")
    alone = await _solo_outputs(client, "w-solo", noise, Q1)
    worker = await make_worker("w-engine", capacity=18, max_adapter_wait_s=0.001)
    assert worker.settings.admission == "engine"
    plan = [adapter for _ in range(3) for adapter in [*noise, None]]
    rids = await asyncio.gather(*(client.send("w-engine", adapter, Q1, max_tokens=16) for adapter in plan))
    results = await client.wait(rids)
    for adapter, rid in zip(plan, rids, strict=True):
        result = results[rid]
        assert result.ok, result.error
        if adapter is not None:
            assert result.text == alone[adapter.name]
            assert result.adapter_digest_applied == adapter.ref.digest
    assert worker.admission.stats.admitted == 15
    assert worker.admission.stats.aged_admissions > 0  # the guard held newcomers, and released them all
    assert worker.admission.waiting == 0


async def test_corrupted_object_fails_closed_with_a_clear_error(make_worker, client, noise, store):
    worker = await make_worker("w-corrupt")
    victim = upload(store, "victim", noise[0].path)
    bad_prefix = f"corrupt/{victim.ref.digest}/"
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        data = (victim.path / name).read_bytes()
        if name.endswith("safetensors"):
            data = data[:-8] + b"\x00" * 8  # flip the last bytes of the weights
        store.client.put_object(store.bucket, bad_prefix + name, io.BytesIO(data), len(data))
    corrupted = UploadedAdapter("corrupt", victim.path, victim.ref.model_copy(update={"object_key": bad_prefix}))
    rid = await client.send("w-corrupt", corrupted, Q1)
    result = (await client.wait([rid]))[rid]
    assert not result.ok and result.error.code == "digest_mismatch"
    assert "failed verification" in result.error.message
    assert result.adapter_digest_applied is None and result.text == ""
    assert not worker.tiers.disk.contains(victim.ref.digest)


async def test_with_s3_stopped_cached_adapters_still_serve(make_worker, client, tones, noise, stack):
    await make_worker("w-s3")
    rid = await client.send("w-s3", tones["pirate"], Q1)
    assert (await client.wait([rid]))[rid].ok
    stack.stop_server("s3")
    try:
        rid = await client.send("w-s3", tones["pirate"], Q2)
        cached = (await client.wait([rid]))[rid]
        assert cached.ok and "Ahoy" in cached.text
        rid = await client.send("w-s3", noise[-1], Q2)
        uncached = (await client.wait([rid]))[rid]
        assert not uncached.ok and uncached.error.code == "adapter_unavailable"
        assert uncached.text == ""  # never silently served by the base model
    finally:
        stack.up()


async def test_incompatible_adapters_are_refused_before_loading(make_worker, client, tones):
    await make_worker("w-compat")
    other_base = UploadedAdapter("x", None, tones["pirate"].ref.model_copy(update={"base_model": "llama-3.1-8b"}))
    too_big = UploadedAdapter("y", None, tones["pirate"].ref.model_copy(update={"rank": 64}))
    lying = UploadedAdapter("z", None, tones["formal"].ref.model_copy(update={"rank": 8}))
    rids = [await client.send("w-compat", a, Q1) for a in (other_base, too_big, lying)]
    results = await client.wait(rids)
    assert [results[r].error.code for r in rids] == ["base_mismatch", "rank_mismatch", "rank_mismatch"]
    assert "max rank 16" in results[rids[1]].error.message


async def test_malformed_messages_are_dead_lettered_and_the_worker_keeps_serving(make_worker, client):
    await make_worker("w-dlq")
    subject = subjects.infer(POOL, "w-dlq", "base")
    await client.js.publish(subject, b"\xff not json", headers={"Nats-Msg-Id": "garbage-1"})
    await client.js.publish(
        subject,
        b'{"schema_version": 1, "request_id": "bad-fields-1", "tenant_id": "t"}',
        headers={"Nats-Msg-Id": "garbage-2"},
    )
    answered = await client.wait(["bad-fields-1"])
    assert answered["bad-fields-1"].error.code == "bad_request"
    assert "base_model" in answered["bad-fields-1"].error.message
    letters = []
    sub = await client.js.pull_subscribe(subjects.dead_letter("worker"), stream=subjects.DLQ_STREAM)
    while len(letters) < 2:
        for msg in await sub.fetch(batch=10, timeout=5):
            letters.append(DeadLetter.model_validate_json(msg.data))
            await msg.ack()
    reasons = {letter.payload[:12]: letter.reason for letter in letters}
    assert any("invalid InferenceRequest" in r for r in reasons.values())
    rid = await client.send("w-dlq", None, Q1, max_tokens=8)
    assert (await client.wait([rid]))[rid].ok


async def test_redelivered_request_is_not_generated_twice(make_worker, client):
    worker = await make_worker("w-dup")
    rid = await client.send("w-dup", None, Q1, max_tokens=8, request_id="dup-req-1")
    await client.wait([rid])
    before = worker.processor.generated_tokens
    # The same request again, stored as a new message (as a retried publish would bring it).
    await client.js.publish(
        subjects.infer(POOL, "w-dup", "base"), _request_bytes(rid), headers={"Nats-Msg-Id": "dup-req-1-again"}
    )
    await asyncio.sleep(2.0)
    assert worker.processor.generated_tokens == before
    assert len(client.results[rid]) == 1


def _request_bytes(rid: str) -> bytes:
    from libs.contracts import InferenceRequest

    return (
        InferenceRequest(
            request_id=rid,
            tenant_id="tenant-e2e",
            base_model="smollm2-135m",
            messages=[{"role": "user", "content": Q1}],
        )
        .model_dump_json()
        .encode()
    )


async def test_expired_deadline_is_an_error_not_a_generation(make_worker, client):
    import time

    await make_worker("w-deadline")
    rid = await client.send("w-deadline", None, Q1, deadline=time.time() - 1)
    result = (await client.wait([rid]))[rid]
    assert not result.ok and result.error.code == "deadline"


async def test_streamed_deltas_add_up_to_the_final_text(make_worker, client, tones):
    await make_worker("w-stream")
    rid = await client.send("w-stream", tones["formal"], Q1, max_tokens=20, stream=True)
    result = (await client.wait([rid]))[rid]
    deltas = sorted(client.deltas.get(rid, []), key=lambda d: d.index)
    assert len(deltas) > 1
    assert "".join(d.text for d in deltas) == result.text
    t = result.timings
    assert t.total_s >= t.ttft_s > 0 and t.adapter_load_s >= 0


async def test_heartbeats_show_the_worker_and_vanish_when_it_dies(make_worker, client, connections):
    from libs.contracts import WorkerHeartbeat

    worker = await make_worker("w-beat")
    kv = await client.js.key_value(subjects.HEARTBEAT_BUCKET)
    beat = WorkerHeartbeat.model_validate_json((await kv.get("w-beat")).value)
    assert beat.pool == POOL and beat.capacity == 8 and beat.max_rank == 16
    ttl = (await kv.status()).ttl  # set by whichever worker created the bucket
    assert ttl and ttl <= 10
    worker.heartbeat.halt()  # stop beating without saying goodbye, as a crash would
    await asyncio.sleep(ttl + 1.5)
    # JetStream expires keys on a timer of its own: on a loaded machine the last one can outlive the TTL
    # by a few seconds (seen once in a full run), so the key must be gone soon after, not at the instant.
    deadline = asyncio.get_running_loop().time() + 15
    while True:
        try:
            await kv.get("w-beat")
        except Exception:  # KeyNotFoundError / KeyDeletedError: the worker left the pool
            break
        assert asyncio.get_running_loop().time() < deadline, "the dead worker's heartbeat never expired"
        await asyncio.sleep(0.5)


async def test_placement_fetches_the_workers_share_before_traffic(make_worker, client, connections, noise):
    """Gateways' demand in the bucket: the worker pre-loads the adapters the ring gives it (alone in the
    pool here: all of them), the two most requested into host RAM, before any request for them."""
    from nats.js.api import KeyValueConfig

    from libs.contracts import AdapterDemand, DemandEntry

    try:
        kv = await client.js.key_value(subjects.ADAPTER_DEMAND_BUCKET)
    except Exception:
        kv = await client.js.create_key_value(KeyValueConfig(bucket=subjects.ADAPTER_DEMAND_BUCKET))
    hot = [noise[3].ref, noise[4].ref]
    for gateway, refs in (("g0", hot), ("g1", hot[1:])):
        entries = [DemandEntry(ref=r, requests=10.0 - i) for i, r in enumerate(refs)]
        demand = AdapterDemand(pool=POOL, gateway_id=gateway, adapters=entries, half_life_s=600)
        await kv.put(subjects.demand_key(POOL, gateway), demand.model_dump_json().encode())
    worker = await make_worker("w-warm", placement_host_ram_top=2, placement_interval_s=0.5)
    deadline = asyncio.get_running_loop().time() + 30
    while worker.placement.stats.resident < 2 or worker.placement.stats.backlog:
        assert asyncio.get_running_loop().time() < deadline, worker.placement.stats
        await asyncio.sleep(0.2)
    assert all(worker.tiers.disk.contains(ref.digest) for ref in hot)
    # the two gateways' counts add up (9 + 10 for noise[4]); other tests' gateways may have counted more
    assert {r.digest for r in hot} <= {r.digest for r in worker.placement.plan.owned}
    rid = await client.send("w-warm", noise[4], Q1, max_tokens=4)
    result = (await client.wait([rid]))[rid]
    assert result.ok and result.adapter_tier in (AdapterTier.GPU, AdapterTier.CPU)
    for gateway in ("g0", "g1"):
        await kv.delete(subjects.demand_key(POOL, gateway))


def test_adapter_ref_is_content_addressed(tones):
    ref: AdapterRef = tones["pirate"].ref
    assert ref.object_key.endswith(f"{ref.digest}/") and ref.rank == 16


async def test_a_second_worker_with_the_same_id_refuses_to_start(make_worker, client, engine, connections, tmp_path):
    from services.worker.app import Worker
    from services.worker.heartbeat import WorkerIdInUse
    from tests.e2e.worker.conftest import worker_settings

    await make_worker("w-dup")
    twin = Worker(worker_settings(connections, tmp_path, "w-dup"), engine=engine)
    with pytest.raises(WorkerIdInUse, match="in use by another live worker"):
        await twin.start()
    await twin.link.close()
    rid = await client.send("w-dup", None, Q1, max_tokens=4)
    assert (await client.wait([rid]))[rid].ok  # the first one still owns its subject and serves
