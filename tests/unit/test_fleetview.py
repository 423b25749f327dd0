"""`lpx top`'s data and frame without a terminal or a broker: heartbeats, limit reports and Prometheus
text in, a FleetSnapshot (its JSON) and the rendered frame out."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import socket
import sys
import termios
from types import SimpleNamespace

from rich.console import Console
from typer.testing import CliRunner

from libs.cli.fleetview_cmds import _live
from libs.cli.main import app
from libs.contracts import AdapterTier, LimitReport, TenantUsageDelta, WorkerHeartbeat
from libs.fleetview import prometheus
from libs.fleetview.rates import BeatHistory, TenantTally
from libs.fleetview.render import ago, render_top, render_where
from libs.fleetview.snapshot import (
    BeatPair,
    ConsumerDepth,
    StreamDepth,
    TenantWindow,
    build_snapshot,
    hottest_adapters,
    placements,
    unlisted_disk,
    worker_row,
)

HOT, WARM, COLD = "a" * 64, "b" * 64, "c" * 64


def beat(
    worker: str = "sim-0",
    ts: float = 100.0,
    *,
    tokens: int = 0,
    requests: dict | None = None,
    instance: str = "i0",
    pool: str = "p16",
    **fields,
) -> WorkerHeartbeat:
    defaults = dict(
        base_model="smollm2-135m",
        max_rank=16,
        capacity=16,
        in_flight=3,
        queued=1,
        max_loras=4,
        max_cpu_loras=16,
        adapters={AdapterTier.GPU: [HOT], AdapterTier.CPU: [WARM], AdapterTier.DISK: [COLD]},
        tier_hits={AdapterTier.GPU: 8, AdapterTier.CPU: 1, AdapterTier.OBJECT_STORE: 1},
        adapter_since={HOT: 90.0, WARM: 80.0, COLD: 70.0},
    )
    return WorkerHeartbeat(
        worker_id=worker,
        pool=pool,
        ts=ts,
        instance=instance,
        generated_tokens=tokens,
        adapter_requests=requests or {},
        **{**defaults, **fields},
    )


def two_workers() -> dict[str, BeatPair]:
    """sim-0 serves HOT at 10 req/s from its gpu slot; sim-1 holds HOT on disk and WARM in gpu, 1 req/s."""
    return {
        "sim-0": BeatPair(
            beat(ts=102.0, tokens=900, requests={HOT: 40, WARM: 5}, bound_passed_on=7),
            beat(ts=100.0, tokens=500, requests={HOT: 20, WARM: 5}),
        ),
        "sim-1": BeatPair(
            beat(
                "sim-1",
                ts=101.0,
                tokens=10,
                requests={WARM: 3},
                adapters={AdapterTier.GPU: [WARM], AdapterTier.DISK: [HOT]},
                adapter_since={WARM: 95.0, HOT: 60.0},
            ),
            beat("sim-1", ts=99.0, tokens=10, requests={WARM: 1}),
        ),
    }


def snapshot(**overrides):
    window = TenantWindow(2.0, {"acme": 6, "beta": 1}, {"acme": 2}, ("gw-0", "gw-1"))
    streams = [StreamDepth("LPX_INFER", 5, (ConsumerDepth("w-p16-sim-0", 4, 2), ConsumerDepth("w-p16-sim-1", 0, 0)))]
    args = dict(
        now=103.0,
        nats_url="nats://127.0.0.1:4222",
        pairs=two_workers(),
        tenants=window,
        streams=streams,
        status_rates={"acme": {"200": 2.5, "429": 0.5}},
    )
    return build_snapshot(**{**args, **overrides})


# --- rates ---------------------------------------------------------------------------------------
def test_tok_s_is_the_token_counter_difference_between_two_beats_of_one_process():
    history = BeatHistory(history_s=10)
    history.add({"sim-0": beat(ts=100, tokens=100)})
    assert history.pairs()["sim-0"].older is None  # one beat: no rate yet
    history.add({"sim-0": beat(ts=100, tokens=100)})  # the same beat read again changes nothing
    history.add({"sim-0": beat(ts=102, tokens=500)})
    assert history.pairs()["sim-0"].rate(lambda b: b.generated_tokens) == 200.0
    history.add({"sim-0": beat(ts=104, tokens=100, instance="restarted")})
    assert history.pairs()["sim-0"].older is None  # a new process counts from zero: no rate across it
    history.add({})
    assert history.pairs() == {}  # gone from the bucket: gone from the view


def test_rates_span_the_history_window_and_a_slow_beater_keeps_its_last_beat():
    history = BeatHistory(history_s=5)
    for ts, tokens in ((100, 0), (103, 300), (106, 600), (109, 900)):
        history.add({"w": beat("w", ts=ts, tokens=tokens)})
    pair = history.pairs()["w"]
    assert (pair.older.ts, pair.newer.ts) == (106, 109) and pair.rate(lambda b: b.generated_tokens) == 100.0
    slow = BeatHistory(history_s=5)
    slow.add({"w": beat("w", ts=100, tokens=0)})
    slow.add({"w": beat("w", ts=120, tokens=2000)})
    assert slow.pairs()["w"].rate(lambda b: b.generated_tokens) == 100.0


def test_tenant_tally_sums_every_gateways_reports_between_takes():
    clock = iter([0.0, 0.5, 0.6, 1.0, 2.0, 6.0, 6.0]).__next__
    tally = TenantTally(clock=clock, stale_s=3.0)
    tally.add(LimitReport(gateway_id="gw-0", tenants={"acme": TenantUsageDelta(requests=3, in_flight=2)}))
    tally.add(
        LimitReport(
            gateway_id="gw-1",
            tenants={"acme": TenantUsageDelta(requests=1, in_flight=1), "beta": TenantUsageDelta(requests=2)},
        )
    )
    tally.add(LimitReport(gateway_id="gw-0", tenants={"acme": TenantUsageDelta(requests=1, in_flight=1)}))
    window = tally.take()  # at 2.0
    assert window.window_s == 2.0 and window.gateways == ("gw-0", "gw-1")
    assert window.requests == {"acme": 5, "beta": 2}
    assert window.in_flight == {"acme": 2}  # gw-0's latest (1) + gw-1's (1)
    tally.add(LimitReport(gateway_id="gw-1", tenants={}))  # at 6.0: gw-0 silent for 5 s
    later = tally.take()
    assert later.requests == {} and later.gateways == ("gw-1",) and later.in_flight == {"acme": 1}


def test_status_rates_from_two_scrapes_and_a_restarted_gateway_counts_from_zero():
    before = prometheus.tenant_status_counts(
        'lpx_gateway_requests_total{endpoint="chat",status="200",tenant="acme"} 10\n'
        'lpx_gateway_requests_total{endpoint="completions",status="200",tenant="acme"} 4\n'
        'lpx_gateway_requests_total{endpoint="chat",status="429",tenant="beta"} 9\n'
        "lpx_gateway_in_flight 3\n"
    )
    assert before == {("acme", "200"): 14.0, ("beta", "429"): 9.0}
    after = {("acme", "200"): 24.0, ("beta", "429"): 2.0}
    assert prometheus.status_rates(before, after, 2.0) == {"acme": {"200": 5.0}, "beta": {"429": 1.0}}
    both = prometheus.merged([{"acme": {"200": 5.0}}, {"acme": {"200": 1.0, "500": 0.5}}])
    assert both == {"acme": {"200": 6.0, "500": 0.5}}


# --- aggregation ---------------------------------------------------------------------------------
def test_hottest_adapters_rank_by_request_rate_and_say_where_they_are():
    rows = hottest_adapters(two_workers().values(), limit=10)
    assert [r.digest for r in rows] == [HOT, WARM]
    hot, warm = rows
    assert hot.req_s == 10.0 and hot.requests == 40  # sim-0: 20 requests in 2 s
    assert [(p.worker_id, p.tier, p.since, p.requests) for p in hot.placements] == [
        ("sim-0", AdapterTier.GPU, 90.0, 40),
        ("sim-1", AdapterTier.DISK, 60.0, None),  # resident there, not among sim-1's hottest
    ]
    assert warm.req_s == 1.0 and warm.requests == 8  # sim-0 idle on it, sim-1 2 requests in 2 s


def test_an_adapter_new_in_a_workers_hottest_has_no_rate_from_that_worker():
    pair = BeatPair(beat(ts=102, requests={HOT: 7}), beat(ts=100, requests={}))
    (row,) = hottest_adapters([pair], limit=5)
    assert row.req_s is None and row.requests == 7


def test_placements_list_every_holder_hottest_tier_first():
    beats = [pair.newer for pair in two_workers().values()]
    assert [(p.worker_id, p.tier) for p in placements(beats, WARM)] == [
        ("sim-1", AdapterTier.GPU),
        ("sim-0", AdapterTier.CPU),
    ]
    assert placements(beats, "d" * 64) == []


def test_snapshot_rows_and_json_shape():
    snap = snapshot()
    body = json.loads(json.dumps(snap.to_json()))
    assert set(body) == {
        "taken_at",
        "nats_url",
        "workers",
        "pools",
        "adapters",
        "tenants",
        "gateways",
        "streams",
        "window_s",
        "notes",
    }
    sim0 = body["workers"][0]
    assert sim0["worker_id"] == "sim-0" and sim0["pool"] == "p16"
    assert (sim0["in_flight"], sim0["capacity"], sim0["queued"], sim0["passed_on"]) == (3, 16, 1, 7)
    assert (sim0["gpu_adapters"], sim0["max_loras"], sim0["cpu_adapters"], sim0["disk_adapters"]) == (1, 4, 1, 1)
    assert sim0["tok_s"] == 200.0 and sim0["beat_age_s"] == 1.0
    assert sim0["tier_hits"] == {"gpu": 8, "cpu": 1, "disk": 0, "object_store": 1}
    assert sim0["hit_rates"]["gpu"] == 0.8
    assert body["workers"][1]["tok_s"] == 0.0
    assert body["pools"] == [{"pool": "p16", "workers": 2, "in_flight": 6, "capacity": 32, "queued": 2, "tok_s": 200.0}]
    assert body["adapters"][0]["placements"][0] == {
        "worker_id": "sim-0",
        "pool": "p16",
        "tier": "gpu",
        "since": 90.0,
        "requests": 40,
    }
    acme, beta = body["tenants"]
    assert acme == {"tenant": "acme", "req_s": 3.0, "in_flight": 2, "by_status": {"200": 2.5, "429": 0.5}}
    assert beta["req_s"] == 0.5 and beta["in_flight"] == 0
    assert body["streams"][0]["consumers"][0] == {"name": "w-p16-sim-0", "pending": 4, "ack_pending": 2}


def test_tenant_rates_are_unknown_without_any_gateway_report():
    snap = snapshot(tenants=TenantWindow(1.0, {}, {}, ()), status_rates={})
    assert snap.tenants == () and snap.gateways == ()


# --- rendering -----------------------------------------------------------------------------------
def frame_text(renderable, width: int = 160) -> str:
    console = Console(record=True, width=width, color_system=None)
    console.print(renderable)
    return console.export_text()


def test_the_frame_shows_workers_adapters_tenants_and_busy_queues():
    text = frame_text(
        render_top(snapshot(notes=("metrics http://gw:9000/metrics: connection refused",)), hint="q quits")
    )
    assert "2 workers in 1 pool, 2 gateways reporting" in text and "(q quits)" in text
    assert "! metrics http://gw:9000/metrics: connection refused" in text
    sim0 = next(line for line in text.splitlines() if "sim-0" in line and "p16" in line)
    for cell in ("3/16", " 7 ", "1/4", "1/16", "200", "80/10/0/10", "1s"):
        assert cell in sim0, (cell, sim0)
    hot = next(line for line in text.splitlines() if HOT[:12] in line)
    assert "10.0" in hot and "sim-0 gpu 13s" in hot and "sim-1 disk 43s" in hot
    acme = next(line for line in text.splitlines() if "acme" in line)
    assert "3.0" in acme and "2.5" in acme and "0.5" in acme
    assert "LPX_INFER" in text and "w-p16-sim-0" in text
    assert "w-p16-sim-1" not in text  # idle consumers are left out


def test_an_empty_fleet_says_so_instead_of_empty_tables():
    empty = build_snapshot(now=1.0, nats_url="nats://x:4222", pairs={}, tenants=TenantWindow(1.0, {}, {}, ()))
    text = frame_text(render_top(empty))
    assert (
        "no live workers" in text
        and "tenants: no requests admitted in the last 1.0s" in text
        and "no platform streams" in text
    )


def test_where_table_and_durations():
    beats = [pair.newer for pair in two_workers().values()]
    text = frame_text(render_where("acme/support", placements(beats, HOT), now=100.0 + 3600))
    lines = [line for line in text.splitlines() if "sim-" in line]
    assert "gpu" in lines[0] and "1h00m" in lines[0] and "40" in lines[0]
    assert "disk" in lines[1] and "1h00m" in lines[1]
    assert "not resident on any live worker" in frame_text(render_where("acme/x", [], now=0))
    assert [ago(s) for s in (4, 192, 7500, 3 * 86400 + 4 * 3600)] == ["4s", "3m12s", "2h05m", "3d04h"]


def test_a_worker_listing_only_its_recent_disk_adapters_counts_them_all_and_may_hold_any():
    """Beats list a bounded share of the disk tier with the whole count: top shows the count, and where
    names the workers that may hold an adapter it does not find listed, instead of a confident "nowhere"."""
    bounded = beat("sim-2", adapter_counts={AdapterTier.GPU: 1, AdapterTier.CPU: 1, AdapterTier.DISK: 900})
    old = beat("sim-3")  # a worker from before adapter_counts: the lists are whole
    assert worker_row(BeatPair(bounded), now=100.0).disk_adapters == 900
    assert worker_row(BeatPair(old), now=100.0).disk_adapters == 1
    unknown = "d" * 64
    assert unlisted_disk([bounded, old], unknown) == ["sim-2"]
    assert unlisted_disk([bounded, old], COLD) == []  # listed: where says so
    text = frame_text(render_where("acme/x", [], now=0, unlisted=["sim-2"]))
    assert "not resident on any live worker" in text and "sim-2" in text and "may hold it on disk" in text


# --- the command with the broker away ------------------------------------------------------------
def test_top_with_nats_down_prints_one_line_and_fails():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again below: nothing listens there
    result = CliRunner().invoke(app, ["top", "--once", "--json", "--nats", f"nats://127.0.0.1:{port}"])
    assert result.exit_code == 1
    assert result.output == f"lpx top: cannot reach NATS at nats://127.0.0.1:{port} (connection refused)\n"


class FakeCollector:
    """Samples on demand: the second fails (the broker away), the third presses `q` on the terminal."""

    def __init__(self, keys: int) -> None:
        self.keys, self.samples, self.closed = keys, 0, False
        self.link = SimpleNamespace(url="nats://fake:4222")

    async def start(self) -> None:
        pass

    async def sample(self):
        self.samples += 1
        if self.samples == 2:
            raise ConnectionError("broker away")
        if self.samples == 3:
            os.write(self.keys, b"q")
        return snapshot()

    async def close(self) -> None:
        self.closed = True


async def test_the_live_view_redraws_through_a_failed_sample_until_q(monkeypatch):
    keys, tty_stdin = pty.openpty()  # what is typed into `keys` arrives on `tty_stdin`
    with os.fdopen(tty_stdin, "r") as stdin:
        monkeypatch.setattr(sys, "stdin", stdin)
        before = termios.tcgetattr(tty_stdin)
        collector = FakeCollector(keys)
        await asyncio.wait_for(_live(collector, interval=0.01), 10)
        assert termios.tcgetattr(tty_stdin) == before  # the terminal is given back as it was
    os.close(keys)
    assert collector.samples == 3 and collector.closed


# --- reading the broker (a fake JetStream) -------------------------------------------------------
class FakeJetStream:
    """A heartbeat bucket with a live beat, a deleted key and a beat this lpx cannot read; LPX_INFER
    with 300 durable consumers (two pages) and one ephemeral."""

    def __init__(self) -> None:
        from nats.js.errors import KeyDeletedError

        self.values = {
            "sim-0": beat().model_dump_json().encode(),
            "gone": KeyDeletedError(),
            "future": b'{"worker_id": "x", "new_field": 1}',
        }

    async def key_value(self, bucket):
        async def get(key):
            value = self.values[key]
            if isinstance(value, Exception):
                raise value
            return SimpleNamespace(value=value)

        return SimpleNamespace(get=get)

    async def stream_info(self, name, subjects_filter=None):
        from nats.js.errors import NotFoundError

        if name.startswith("KV_"):
            keys = {f"$KV.lpx_workers.{key}": 1 for key in self.values}
            return SimpleNamespace(state=SimpleNamespace(subjects=keys))
        if name != "LPX_INFER":
            raise NotFoundError()
        return SimpleNamespace(state=SimpleNamespace(messages=7))

    async def consumers_info(self, stream, offset=None):
        durable = [
            SimpleNamespace(
                name=f"w-{i:03d}",
                num_pending=i % 3,
                num_ack_pending=0,
                config=SimpleNamespace(durable_name=f"w-{i:03d}"),
            )
            for i in range(300)
        ]
        ephemeral = SimpleNamespace(
            name="eph", num_pending=9, num_ack_pending=0, config=SimpleNamespace(durable_name=None)
        )
        everything = [*durable, ephemeral]
        return everything[offset or 0 :][:256]


async def test_reading_heartbeats_and_queues_from_the_broker():
    from libs.fleetview.sources import read_heartbeats, read_streams

    js = FakeJetStream()
    read = await read_heartbeats(js)
    assert list(read.beats) == ["sim-0"] and read.unreadable == 1  # the deleted key is simply gone
    (infer,) = await read_streams(js)
    assert infer.stream == "LPX_INFER" and infer.messages == 7
    assert len(infer.consumers) == 300 and infer.consumers[0].pending == 2  # busiest first, ephemeral left out
