"""A 3-node JetStream cluster (streams and buckets R3) under load: SIGKILL the leader of the
work-queue stream, then (after it is back) a follower. Clients hold every node URL and ride out
the leader election; nothing accepted is lost, nothing is answered twice."""

from __future__ import annotations

import time

import pytest

from libs.contracts import subjects
from tests.chaos.drills import run_drill
from tests.chaos.load import seconds_until_serving

pytestmark = [pytest.mark.e2e, pytest.mark.chaos]


@pytest.fixture(scope="module")
async def cluster(platform_of):
    return await platform_of(3)


async def _node(platform, role: str) -> str:
    nc, js = await platform.jetstream()
    try:
        info = await js.stream_info(subjects.INFER_STREAM)
    finally:
        await nc.close()
    assert info.config.num_replicas == 3
    leader = info.cluster.leader
    if role == "leader":
        name = leader
    else:
        name = next(r.name for r in info.cluster.replicas if r.name != leader)
    return name.removeprefix("lpx-")


@pytest.mark.parametrize("role", ["leader", "follower"])
async def test_kill_one_node_loses_nothing(cluster, chaos_report, role):
    # The drill starts on a serving platform: the previous drill's node has just been restarted. How long
    # that took is in the report's notes (a platform that refused requests after a node rejoined once
    # made this drill fail before its fault).
    ready_s = await seconds_until_serving(cluster, time.monotonic())
    node = await _node(cluster, role)

    async def kill(_load) -> None:
        await cluster.kill(node)

    report, logs = await run_drill(cluster, f"3-node cluster: SIGKILL the work queue's {role} ({node})", breaks=kill)
    report.notes += f"; serving {ready_s} s after the previous drill's repair"
    await cluster.restart_broker()  # back for the next drill
    chaos_report.append(report)
    assert report.lost == 0 and report.answered_twice == 0 and report.wrong_adapter == 0, report
    assert report.correct == report.sent, report
    assert report.seconds_to_serve_again is not None, report
    assert not logs.tracebacks, logs.tracebacks[:5]
