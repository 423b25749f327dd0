"""Exactly once: a gate SIGKILLed mid-evaluation and restarted finishes the evaluation once (one
verdict in JetStream, one activation); a redelivered event is answered with the recorded verdict,
not evaluated again; a malformed event is dead-lettered and the gate keeps going."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid

import nats
import pytest

from libs.contracts import AdapterEvent, DeadLetter, EvaluationResult, subjects
from tests.e2e.eval_gate.conftest import distinct_copy, metric_points, new_tenant, push, wait_for_verdict
from tests.integration.registry.events import stream_messages, wait_until

pytestmark = pytest.mark.e2e


async def verdicts_for(nats_url: str, digest: str) -> list[EvaluationResult]:
    msgs = await stream_messages(nats_url, subjects.EVENTS_STREAM, subjects.EVALUATED)
    results = [EvaluationResult.model_validate_json(m.data) for m in msgs]
    return [r for r in results if r.digest == digest]


def _gate_process(env: dict, log_path) -> subprocess.Popen:
    log = open(log_path, "a")
    # Its own process group: SIGKILL takes the gate and its vLLM engine processes down together.
    return subprocess.Popen(
        [sys.executable, "-m", "services.eval_gate"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


async def _wait_for_log(proc: subprocess.Popen, log_path, text: str, timeout_s: float = 240) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        if text in log_path.read_text(errors="replace"):
            return
        assert proc.poll() is None, f"the gate exited early:\n{log_path.read_text()[-3000:]}"
        await asyncio.sleep(0.5)
    raise AssertionError(f"{text!r} not in the gate's log within {timeout_s}s")


def _kill(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)


async def test_gate_killed_mid_evaluation_completes_exactly_once(
    stack, connections, gate_registry, tones, base_model_path, tmp_path
):
    # A base of its own (same shapes as SmolLM2), so that only the subprocess gates evaluate it.
    base = f"smollm2-kill-{uuid.uuid4().hex[:4]}"
    config = json.loads((base_model_path / "config.json").read_text())
    registered = await gate_registry.client.post("/v1/base-models", json={"name": base, "config": config})
    assert registered.status_code == 201, registered.text
    env = {
        **os.environ,
        "LPX_ENV_FILE": str(stack.env_file),
        "LPX_EVAL_GATE_BASE_MODEL": base,
        "LPX_EVAL_GATE_MODEL_PATH": str(base_model_path),
        "LPX_EVAL_GATE_DURABLE": f"kill-{uuid.uuid4().hex[:8]}",
        "LPX_EVAL_GATE_DELIVER_POLICY": "new",
        "LPX_EVAL_GATE_ACK_WAIT_S": "10",
        "LPX_EVAL_GATE_WORK_DIR": str(tmp_path / "work"),
        "VLLM_CPU_KVCACHE_SPACE": "1",
    }
    log_path = tmp_path / "gate.log"
    tenant = await new_tenant(gate_registry, "kill")
    path = distinct_copy(tones["pirate"].path, tmp_path / "copy", "kill-test", base=base)
    first = _gate_process({**env, "LPX_EVAL_GATE_GATE_ID": "gate-first"}, log_path)
    second = None
    try:
        await _wait_for_log(first, log_path, "eval gate gate-first ready")
        version = await push(gate_registry, tenant, "support", path, base=base)

        async def claimed():
            row = (await gate_registry.client.get(f"/v1/tenants/{tenant}/aliases/support-v1")).json()
            return row["status"] == "evaluating"

        assert await wait_until(claimed, timeout_s=60, interval_s=0.05)
        await asyncio.sleep(1.0)  # inside the evaluation (it takes several seconds)
        _kill(first)
        mid = (await gate_registry.client.get(f"/v1/tenants/{tenant}/aliases/support-v1")).json()
        assert mid["status"] == "evaluating" and not await verdicts_for(connections.nats_url, version["digest"])

        second = _gate_process({**env, "LPX_EVAL_GATE_GATE_ID": "gate-second"}, log_path)
        row = await wait_for_verdict(gate_registry, tenant, "support", 1, timeout_s=300)
    finally:
        _kill(first)
        if second is not None:
            _kill(second)
    assert row["status"] == "active", row["status_reason"]
    assert row["eval_report"]["gate"]["gate_id"] == "gate-second" and row["eval_report"]["gate"]["attempt"] == 2
    verdicts = await verdicts_for(connections.nats_url, version["digest"])
    assert len(verdicts) == 1 and verdicts[0].passed


async def test_a_redelivered_event_is_not_evaluated_twice(connections, gate_registry, gate, tones, tmp_path):
    tenant = await new_tenant(gate_registry, "dup")
    path = distinct_copy(tones["pirate"].path, tmp_path / "copy", "duplicate-test")
    version = await push(gate_registry, tenant, "support", path)
    assert (await wait_for_verdict(gate_registry, tenant, "support", 1))["status"] == "active"
    evaluated = gate.evaluated
    events = await stream_messages(connections.nats_url, subjects.EVENTS_STREAM, subjects.adapter_event("registered"))
    original = next(m for m in events if AdapterEvent.model_validate_json(m.data).digest == version["digest"])
    nc = await nats.connect(connections.nats_url)
    try:
        js = nc.jetstream()
        # The same event again under another Nats-Msg-Id (JetStream's de-duplication does not catch it).
        copy = await js.publish(original.subject, original.data, headers={"Nats-Msg-Id": uuid.uuid4().hex})
        junk = [
            copy,
            await js.publish(subjects.adapter_event("registered"), b'{"kind": "registered", "tenant": 1}'),
            await js.publish(subjects.adapter_event("registered"), b"not json at all"),
        ]

        async def letters():
            msgs = await stream_messages(connections.nats_url, subjects.DLQ_STREAM, subjects.dead_letter("eval-gate"))
            found = [DeadLetter.model_validate_json(m.data) for m in msgs]
            return [d for d in found if d.payload in ('{"kind": "registered", "tenant": 1}', "not json at all")]

        dead = await wait_until(letters, timeout_s=30)
        assert len(dead) == 2 and all(d.reason.startswith("malformed AdapterEvent") for d in dead)
        for ack in junk:  # the events stream is shared by the session's tests: leave only real events
            await js.delete_msg(subjects.EVENTS_STREAM, ack.seq)
    finally:
        await nc.drain()
    await asyncio.sleep(2.0)
    assert gate.evaluated == evaluated
    assert len(await verdicts_for(connections.nats_url, version["digest"])) == 1
    # ...and the gate still evaluates what comes next.
    later = await new_tenant(gate_registry, "after")
    await push(gate_registry, later, "support", tones["pirate"].path)
    assert (await wait_for_verdict(gate_registry, later, "support", 1))["status"] == "active"
    # Its metrics tell the same story.
    reader = gate.metric_reader
    assert metric_points(reader, "lpx_eval_gate_skipped").get((("reason", "duplicate"),), 0) >= 1
    evaluations = metric_points(reader, "lpx_eval_gate_evaluations")
    assert evaluations.get((("outcome", "passed"),), 0) >= 2
    assert metric_points(reader, "lpx_eval_gate_duration_seconds")
    assert metric_points(reader, "lpx_eval_gate_running") == {(): 0}
