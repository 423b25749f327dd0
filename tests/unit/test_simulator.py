"""The routing simulator: hand-checkable engine behaviour, invariants, determinism, and the headline result."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from libs.cli import simulate as simulate_cli
from libs.simulator.config import SimConfig
from libs.simulator.engine import TIER_COLD, TIER_GPU, TIER_HOST, Scenario, Simulation, simulate
from libs.simulator.metrics import summarise
from libs.simulator.runner import run_comparison
from libs.simulator.traffic import Traffic, make_traffic
from libs.simulator.zipf import solve_zipf_exponent, top_share

REPO = Path(__file__).resolve().parents[2]

# A reduced but meaningful scale: 500 adapters (top 25 carry 80%), 10 replicas, 125 req/s (the reference's
# per-replica rate), 5 measured minutes after a 1-minute warm-up: ~45,000 requests per policy.
SMALL = SimConfig(adapters=500, top_k=25, replicas=10, requests_per_s=125.0, duration_s=300.0, warmup_s=60.0)


def steady(config: SimConfig) -> Scenario:
    return Scenario("steady", config.warmup_s, config.duration_s)


def small_traffic(config: SimConfig = SMALL) -> Traffic:
    return make_traffic(
        config.adapters,
        config.top_k,
        config.top_share,
        config.requests_per_s,
        config.warmup_s + config.duration_s,
        config.seed,
    )


@pytest.mark.parametrize(("n", "k", "share"), [(2000, 100, 0.8), (20_000, 100, 0.8), (50, 5, 0.3)])
def test_zipf_exponent_reproduces_the_requested_top_share(n, k, share):
    exponent = solve_zipf_exponent(n, k, share)
    assert top_share(n, k, exponent) == pytest.approx(share, abs=1e-7)


def test_zipf_rejects_impossible_skews():
    with pytest.raises(ValueError):
        solve_zipf_exponent(100, 10, 0.05)  # less than uniform
    with pytest.raises(ValueError):
        solve_zipf_exponent(100, 100, 0.9)


def test_traffic_is_poisson_at_the_rate_and_zipf_skewed():
    cfg = SMALL
    traffic = small_traffic()
    horizon = cfg.warmup_s + cfg.duration_s
    expected = cfg.requests_per_s * horizon
    assert abs(len(traffic) - expected) < 5 * math.sqrt(expected)
    assert all(a <= b for a, b in zip(traffic.arrival_s, traffic.arrival_s[1:], strict=False))
    top = sum(1 for r in traffic.adapter_rank if r < cfg.top_k) / len(traffic)
    assert top == pytest.approx(cfg.top_share, abs=0.01)


def hand_config(**changes) -> SimConfig:
    """One replica, deterministic fetch time: every number below can be worked out by hand."""
    base = dict(
        adapters=4,
        top_k=1,
        top_share=0.5,
        replicas=1,
        requests_per_s=1.0,
        duration_s=100.0,
        warmup_s=0.0,
        fetch_s_min=1.0,
        fetch_s_max=1.0,
        adapter_bytes=25_000_000,
        host_to_gpu_gb_s=25.0,
        tok_s_per_replica=6400.0,
        max_running=64,
        output_tokens=300,
        mixed_adapter_overhead=0.1,
    )
    base.update(changes)
    return SimConfig(**base)


def run_hand(config: SimConfig, arrivals: list[float], ranks: list[int]):
    traffic = Traffic(arrivals, ranks, zipf_exponent=1.0, horizon_s=config.duration_s)
    sim = Simulation(config, "random", traffic, Scenario("hand", 0.0, config.duration_s))
    return sim, sim.run()


def test_first_request_pays_fetch_and_copy_then_slot_hits_are_free():
    cfg = hand_config()
    sim, result = run_hand(cfg, [0.0, 10.0, 20.0], [0, 0, 0])
    copy_s = 25_000_000 / 25e9  # 1 ms
    # Alone in the batch: one distinct adapter, so the batch runs 1 / 1.1 of the fully mixed time.
    service_s = 300 / (6400 / 64) / 1.1
    assert result.tiers == [TIER_COLD, TIER_GPU, TIER_GPU]
    assert result.latency_s[0] == pytest.approx(1.0 + copy_s + service_s)
    assert result.latency_s[1] == pytest.approx(service_s)
    assert result.cold_loads == 1 and result.host_loads == 0


def test_concurrent_requests_share_one_fetch():
    cfg = hand_config()
    _, result = run_hand(cfg, [0.0, 0.2, 0.4], [1, 1, 1])
    assert result.cold_loads == 1
    assert result.tiers == [TIER_COLD] * 3


def test_lru_engine_slots_evict_and_reload_from_host_ram():
    cfg = hand_config(engine_slots=2)
    # Adapters 0, 1, 2 each once (three cold fetches), then 0 again: slot LRU evicted it, host RAM has it.
    _, result = run_hand(cfg, [0.0, 10.0, 20.0, 30.0], [0, 1, 2, 0])
    assert result.cold_loads == 3
    assert result.tiers == [TIER_COLD, TIER_COLD, TIER_COLD, TIER_HOST]
    assert result.host_loads == 1


def test_batch_limit_queues_requests():
    cfg = hand_config(max_running=1)
    _, result = run_hand(cfg, [0.0, 0.0], [0, 0])
    # One seat: the sequence gets the replica's whole 6,400 tok/s. Both requests wait for the same fetch;
    # the second then waits for the first to finish and starts on a slot hit (no copy).
    service_s = 300 / 6400 / 1.1
    assert result.latency_s[0] == pytest.approx(1.0 + 25_000_000 / 25e9 + service_s)
    assert result.latency_s[1] == pytest.approx(result.latency_s[0] + service_s)


def test_every_request_is_served_exactly_once():
    cfg = SMALL.with_changes(duration_s=60.0, warmup_s=10.0)
    traffic = small_traffic(cfg)
    for policy in ("random", "consistent_hash", "bounded_load", "gie_lora_affinity", "ray_multiplex"):
        result = simulate(cfg, policy, traffic, steady(cfg))
        in_window = sum(1 for t in traffic.arrival_s if cfg.warmup_s <= t < cfg.warmup_s + cfg.duration_s)
        assert result.served_once, policy
        assert result.measured == in_window == len(result.latency_s), policy
        assert min(result.latency_s) > 0, policy


def test_bounded_load_never_assigns_above_the_bound():
    cfg = SMALL.with_changes(duration_s=60.0, warmup_s=10.0)
    sim = Simulation(cfg, "bounded_load", small_traffic(cfg), steady(cfg))
    checked = []
    choose = sim.policy.choose

    def checked_choose(adapter, view):
        worker = choose(adapter, view)
        # The bound recomputed here by hand: ceil(c x (in flight + this one) / replicas).
        cap = math.ceil(cfg.balance_factor * (view.total_load + 1) / cfg.replicas - 1e-9)
        assert view.loads[worker] + 1 <= cap
        assert sum(view.loads.values()) == view.total_load
        checked.append(worker)
        return worker

    sim.policy.choose = checked_choose
    result = sim.run()
    assert len(checked) == result.requests
    assert result.bound_violations == 0


def test_same_seed_same_report_and_another_seed_differs():
    cfg = SMALL.with_changes(duration_s=40.0, warmup_s=10.0, storm_window_s=10.0)
    policies = ["random", "bounded_load", "ray_multiplex"]

    def report(seed: int) -> str:
        data = run_comparison(cfg.with_changes(seed=seed), policies).to_dict()
        data.pop("wall_s")
        for section in ("steady", "cold_start", "cold_start_prewarmed", "placed", "placed_churn"):
            for summary in data[section].values():
                summary.pop("wall_s")
        return json.dumps(data, sort_keys=True, default=str)

    assert report(3) == report(3)
    assert report(3) != report(4)


def test_bounded_load_cuts_adapter_loads_tenfold_versus_random_within_the_bound():
    traffic = small_traffic()
    ours = summarise(simulate(SMALL, "bounded_load", traffic, steady(SMALL)))
    theirs = summarise(simulate(SMALL, "random", traffic, steady(SMALL)))
    assert theirs["loads_per_1000"] >= 10 * ours["loads_per_1000"]
    assert ours["bound_violations"] == 0 and ours["max_bound_use"] <= 1.0
    assert ours["max_over_mean_load"] <= SMALL.balance_factor
    assert ours["slot_hit_rate"] > theirs["slot_hit_rate"]
    assert ours["replicas_per_adapter_weighted"] < 0.75 * theirs["replicas_per_adapter_weighted"]


def test_plain_consistent_hashing_overloads_the_hot_adapters_home():
    cfg = SMALL.with_changes(duration_s=60.0, warmup_s=10.0)
    traffic = small_traffic(cfg)
    plain = summarise(simulate(cfg, "consistent_hash", traffic, steady(cfg)))
    bounded = summarise(simulate(cfg, "bounded_load", traffic, steady(cfg)))
    assert plain["max_over_mean_load"] > 2 * cfg.balance_factor
    assert plain["latency_p99_s"] > 5 * bounded["latency_p99_s"]


def test_prewarming_the_top_adapters_softens_the_cold_start_storm():
    cfg = SMALL.with_changes(storm_window_s=30.0, prewarm_top=25)
    traffic = small_traffic(cfg)
    cold = simulate(cfg, "random", traffic, Scenario("cold_start", 0.0, cfg.storm_window_s))
    warm = simulate(cfg, "random", traffic, Scenario("cold_start_prewarmed", 0.0, cfg.storm_window_s, 25))
    assert warm.cold_loads < 0.8 * cold.cold_loads
    assert summarise(warm)["slot_hit_rate"] > summarise(cold)["slot_hit_rate"]


def _cli() -> typer.Typer:
    app = typer.Typer()
    simulate_cli.register(app)

    @app.command("noop", hidden=True)
    def _noop() -> None:  # a second command keeps typer from collapsing the app into `simulate`
        pass

    return app


def test_simulate_command_writes_json_and_plots(tmp_path):
    args = [
        "simulate",
        "--policies",
        "random,bounded_load",
        "--adapters",
        "200",
        "--top-k",
        "10",
        "--replicas",
        "4",
        "--requests-per-s",
        "50",
        "--duration-s",
        "20",
        "--warmup-s",
        "5",
        "--storm-window-s",
        "5",
        "--out",
        str(tmp_path),
        "--json",
    ]
    result = CliRunner().invoke(_cli(), args)
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "report.json").read_text())
    assert set(report["steady"]) == {"random", "bounded_load"}
    assert report["loads_ratio_random_over_bounded_load"] > 0
    for name in ("loads_per_1000.png", "latency.png", "load_balance.png", "cold_start.png"):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"


def test_simulate_command_rejects_unknown_policies():
    result = CliRunner().invoke(_cli(), ["simulate", "--policies", "round_robin", "--duration-s", "5"])
    assert result.exit_code != 0


def test_report_does_not_depend_on_python_hash_randomisation():
    script = (
        "import json\n"
        "from libs.simulator.config import SimConfig\n"
        "from libs.simulator.runner import run_comparison\n"
        "cfg = SimConfig(adapters=200, top_k=10, replicas=5, requests_per_s=60.0, duration_s=20.0,\n"
        "                warmup_s=5.0, storm_window_s=5.0)\n"
        "r = run_comparison(cfg, ['bounded_load', 'ray_multiplex', 'gie_lora_affinity']).steady\n"
        "print(json.dumps({k: [v['loads_per_1000'], v['latency_p99_s']] for k, v in r.items()}))\n"
    )
    outputs = set()
    for seed in ("11", "12"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(REPO)}
        done = subprocess.run([sys.executable, "-c", script], env=env, cwd=REPO, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        outputs.add(done.stdout)
    assert len(outputs) == 1


def test_placement_preloads_the_ring_share_so_ring_routed_requests_are_rarely_cold():
    # the oracle (true popularity, every adapter): the most placement can do
    cfg = SMALL.with_changes(duration_s=60.0, warmup_s=60.0, placement_fetch_per_s=20.0, placement_demand="oracle")
    traffic = small_traffic(cfg)
    plain = simulate(cfg, "bounded_load", traffic, steady(cfg))
    placed = simulate(cfg, "bounded_load", traffic, Scenario("placed", cfg.warmup_s, cfg.duration_s, placement=True))
    # every replica fetched its share: the 500 adapters once per ring position that places them (2, as the
    # workers), but those a request fetched first
    copies = cfg.adapters * cfg.placement_successors
    assert cfg.placement_successors == 2 and 0.9 * copies <= placed.placement_fetches <= copies
    # ... so requests rarely wait on the object store; random routing gains nothing from the ring's share
    assert placed.cold_loads * 10 < plain.cold_loads
    assert placed.served_once
    scattered = simulate(cfg, "random", traffic, Scenario("placed", cfg.warmup_s, cfg.duration_s, placement=True))
    assert scattered.cold_loads > 5 * placed.cold_loads


def test_churn_moves_the_share_and_the_run_still_ends_with_everything_served_once():
    cfg = SMALL.with_changes(duration_s=60.0, warmup_s=30.0, placement_fetch_per_s=50.0)
    traffic = small_traffic(cfg)
    churn = Scenario("placed_churn", cfg.warmup_s, cfg.duration_s, placement=True, churn_every_s=20.0)
    calm = simulate(cfg, "bounded_load", traffic, Scenario("placed", cfg.warmup_s, cfg.duration_s, placement=True))
    moved = simulate(cfg, "bounded_load", traffic, churn)
    assert moved.served_once
    # each return refetches the returning replica's share and each leave spreads it over the others
    assert moved.placement_fetches > calm.placement_fetches


def test_placement_by_demand_seen_places_only_requested_adapters_onto_disk_and_refills_after_churn():
    """As the workers do: rank by the requests seen so far, place onto the local disk tier. Requests fetch
    their own adapters onto disk anyway, so what seen demand buys is the share that moves at churn; the
    oracle, which knows every adapter before its first request, bounds it from below."""
    cfg = SMALL.with_changes(
        duration_s=60.0,
        warmup_s=30.0,
        placement_fetch_per_s=50.0,
        host_cache_adapters=20,
        disk_cache_adapters=500,
        placement_demand="seen",
    )
    traffic = small_traffic(cfg)
    churn = Scenario("placed_churn", cfg.warmup_s, cfg.duration_s, placement=True, churn_every_s=20.0)
    plain = simulate(cfg, "bounded_load", traffic, steady(cfg))
    seen = simulate(cfg, "bounded_load", traffic, churn)
    oracle = simulate(cfg.with_changes(placement_demand="oracle"), "bounded_load", traffic, churn)
    requested = len(set(traffic.adapter_rank[: seen.requests]))
    assert seen.served_once and oracle.served_once
    assert 0 < seen.placement_fetches and seen.placement_fetches < oracle.placement_fetches
    assert requested < cfg.adapters  # the tail was never asked for: seen demand cannot place it
    # every cold load not from disk is an object-store fetch; after churn, placement moved loads from S3 to disk
    assert plain.object_fetches <= plain.cold_loads
    assert seen.object_fetches < 0.8 * seen.cold_loads
    assert oracle.object_fetches * 5 < seen.object_fetches
    summary = summarise(seen)
    assert summary["object_fetches_per_1000"] == pytest.approx(seen.object_fetches * 1000 / seen.measured)


def test_placement_of_every_active_adapter_comes_close_to_the_oracle():
    """As the workers place now: the requested ones first, then every other active adapter (the registry's
    set) in an order unrelated to popularity. The whole share fits the disk, so it ends where the oracle
    does: a request rarely waits on the object store, where demand alone leaves the unseen tail cold."""
    cfg = SMALL.with_changes(
        duration_s=60.0, warmup_s=30.0, placement_fetch_per_s=50.0, host_cache_adapters=20, disk_cache_adapters=500
    )
    assert cfg.placement_demand == "active"  # the default models the workers
    traffic = small_traffic(cfg)
    placed = Scenario("placed", cfg.warmup_s, cfg.duration_s, placement=True)
    active = simulate(cfg, "bounded_load", traffic, placed)
    seen = simulate(cfg.with_changes(placement_demand="seen"), "bounded_load", traffic, placed)
    oracle = simulate(cfg.with_changes(placement_demand="oracle"), "bounded_load", traffic, placed)
    assert active.served_once
    assert active.object_fetches <= oracle.object_fetches + 5
    assert active.object_fetches * 5 < seen.object_fetches


def test_requests_the_workers_pass_on_leave_the_ring_and_cost_loads():
    # about 2 in flight per replica, as in bench_fleet: requests often fill their replica to the bound
    cfg = SMALL.with_changes(duration_s=60.0, warmup_s=30.0, requests_per_s=50.0, output_tokens=32)
    traffic = small_traffic(cfg)
    kept = summarise(simulate(cfg, "bounded_load", traffic, steady(cfg)))
    handed_cfg = cfg.with_changes(handoff_share=0.2)
    handed = summarise(simulate(handed_cfg, "bounded_load", traffic, steady(handed_cfg)))
    assert kept["passed_on_per_1000"] == 0
    assert 150 < handed["passed_on_per_1000"] < 250  # the share asked for
    assert handed["loads_per_1000"] > kept["loads_per_1000"] * 1.1  # away from the ring: more loads
    assert handed["served_exactly_once"]
    with pytest.raises(ValueError):
        SMALL.with_changes(handoff_share=1.0)
