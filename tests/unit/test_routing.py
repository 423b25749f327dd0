"""The adapter-affinity router: stability, the load bound, hot spreading, determinism, peer policies."""

from __future__ import annotations

import hashlib
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from libs.routing import (
    POLICY_NAMES,
    BoundedLoadRouter,
    GieLoraAffinityPolicy,
    HashRing,
    NoWorkersError,
    RayMultiplexPolicy,
    load_bound,
    make_policy,
    stable_hash64,
)

REPO = Path(__file__).resolve().parents[2]
WORKERS = [f"worker-{i:02d}" for i in range(10)]
KEYS = [f"adapter-{i:05d}" for i in range(10_000)]


def owners(ring: HashRing) -> dict[str, str]:
    return {key: ring.primary(key) for key in KEYS}


def test_stable_hash_is_blake2b_of_the_utf8_key():
    key = "tenant-münchen-v4"  # non-ASCII on purpose: the key is hashed as UTF-8
    expected = int.from_bytes(hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest(), "big")
    assert stable_hash64(key) == expected


def test_assignment_is_identical_across_processes_with_different_hash_seeds():
    script = (
        "from libs.routing import BoundedLoadRouter\n"
        "r = BoundedLoadRouter(workers=[f'w{i}' for i in range(7)])\n"
        "print(','.join(r.primary(f'a{i}') for i in range(300)))\n"
    )
    outputs = set()
    for seed in ("1", "2", "random"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(REPO)}
        done = subprocess.run([sys.executable, "-c", script], env=env, cwd=REPO, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        outputs.add(done.stdout)
    assert len(outputs) == 1


def test_adding_a_worker_moves_about_one_nth_of_keys_and_only_to_it():
    before = owners(HashRing(WORKERS))
    after = owners(HashRing([*WORKERS, "worker-new"]))
    moved = [k for k in KEYS if before[k] != after[k]]
    assert all(after[k] == "worker-new" for k in moved)
    expected = len(KEYS) / (len(WORKERS) + 1)
    assert 0.6 * expected < len(moved) < 1.4 * expected


def test_removing_a_worker_moves_only_its_keys():
    before = owners(HashRing(WORKERS))
    after = owners(HashRing(WORKERS[1:]))
    moved = {k for k in KEYS if before[k] != after[k]}
    assert moved == {k for k in KEYS if before[k] == WORKERS[0]}
    expected = len(KEYS) / len(WORKERS)
    assert 0.6 * expected < len(moved) < 1.4 * expected


def test_virtual_nodes_spread_keys_evenly():
    counts = {w: 0 for w in WORKERS}
    for owner in owners(HashRing(WORKERS, vnodes=160)).values():
        counts[owner] += 1
    mean = len(KEYS) / len(WORKERS)
    assert max(counts.values()) < 1.3 * mean
    assert min(counts.values()) > 0.7 * mean


def test_preference_list_visits_every_worker_once_primary_first():
    ring = HashRing(WORKERS)
    order = ring.preference_list("adapter-7")
    assert sorted(order) == sorted(WORKERS)
    assert order[0] == ring.primary("adapter-7")


def test_load_bound_is_ceil_of_c_times_mean_after_assignment():
    # 95 in flight + this request = 96 over 8 workers: mean 12, 1.25 x 12 = 15 exactly.
    assert load_bound(95, 8, 1.25) == 15
    # 96 + 1 = 97 over 8: mean 12.125, 1.25 x 12.125 = 15.156 -> 16.
    assert load_bound(96, 8, 1.25) == 16
    assert load_bound(0, 40, 1.25) == 1


def test_idle_cluster_routes_to_the_primary():
    router = BoundedLoadRouter(workers=WORKERS)
    decision = router.route("adapter-1", {})
    assert decision.worker == router.primary("adapter-1")
    assert decision.affinity_hit and not decision.spilled and decision.candidates_tried == 1


def test_overloaded_primary_spills_to_the_next_successor_on_the_ring():
    router = BoundedLoadRouter(c=1.25, workers=WORKERS)
    order = router.successors("adapter-1")
    loads = {w: 10 for w in WORKERS}
    loads[order[0]] = 13  # total 103 -> bound ceil(1.25 * 104 / 10) = 13: primary is full
    decision = router.route("adapter-1", loads)
    assert decision.worker == order[1]
    assert not decision.affinity_hit and decision.spilled and decision.candidates_tried == 2


@pytest.mark.parametrize("seed", range(25))
def test_bound_holds_under_adversarial_loads(seed):
    rng = random.Random(seed)
    workers = [f"w{i}" for i in range(rng.randint(1, 30))]
    router = BoundedLoadRouter(c=rng.choice([1.05, 1.25, 2.0]), workers=workers)
    for _ in range(200):
        # Skewed loads: most workers idle, a few far above the mean, some exactly at the bound.
        loads = {w: rng.choice([0, 0, 1, rng.randint(0, 500)]) for w in workers}
        total = sum(loads.values())
        cap = math.ceil(router.c * (total + 1) / len(workers) - 1e-9)
        for w in rng.sample(workers, k=min(3, len(workers))):
            loads[w] = cap  # exactly at the bound: must be skipped
        total = sum(loads.values())
        cap = math.ceil(router.c * (total + 1) / len(workers) - 1e-9)
        adapter = f"adapter-{rng.randrange(1000)}"
        hot = {adapter: rng.choice([0, 5, 50, 500])}
        decision = router.route(adapter, loads, adapter_loads=hot)
        assert loads[decision.worker] + 1 <= cap


def test_routing_a_stream_never_exceeds_the_bound():
    router = BoundedLoadRouter(workers=WORKERS)
    loads = dict.fromkeys(WORKERS, 0)
    rng = random.Random(7)
    for step in range(5000):
        adapter = "adapter-hot" if rng.random() < 0.5 else f"adapter-{rng.randrange(50)}"
        total = sum(loads.values())
        decision = router.route(adapter, loads, total_load=total)
        assert loads[decision.worker] + 1 <= load_bound(total, len(WORKERS), router.c)
        loads[decision.worker] += 1
        if step % 3 == 0:  # departures keep the load from growing without end
            busy = [w for w, n in loads.items() if n]
            loads[rng.choice(busy)] -= 1


def test_hot_adapter_spreads_over_its_first_successors_least_loaded_first():
    router = BoundedLoadRouter(hot_threshold=10, max_spread=4, workers=WORKERS)
    order = router.successors("adapter-hot")
    loads = dict.fromkeys(WORKERS, 10)
    loads[order[0]], loads[order[1]], loads[order[2]] = 9, 8, 6  # all under the bound ceil(1.25 * 94 / 10) = 12
    # 35 in flight -> width 1 + 35 // 10 = 4: the least loaded of the first four successors wins.
    decision = router.route("adapter-hot", loads, adapter_loads={"adapter-hot": 35})
    assert decision.worker == order[2]
    assert not decision.spilled
    # A cold adapter (below the threshold) still goes to its primary.
    assert router.route("adapter-hot", loads, adapter_loads={"adapter-hot": 3}).worker == order[0]


def test_spread_width_grows_with_in_flight_requests_and_is_capped():
    router = BoundedLoadRouter(hot_threshold=8, max_spread=5, workers=WORKERS)
    assert [router.spread_width(a) for a in (0, 7, 8, 16, 1000)] == [1, 1, 2, 3, 5]


def test_no_workers_fails_loudly():
    with pytest.raises(NoWorkersError):
        BoundedLoadRouter().route("adapter-1", {})


def test_invalid_parameters_are_rejected():
    with pytest.raises(ValueError):
        BoundedLoadRouter(c=1.0)
    with pytest.raises(ValueError):
        make_policy("round_robin", WORKERS)


class FakeView:
    """A hand-built ClusterView."""

    def __init__(self, workers, loads=None, running=None, active=None, waiting=None, resident=None):
        self.loads = loads or dict.fromkeys(workers, 0)
        self.total_load = sum(self.loads.values())
        self.adapter_loads = {}
        self.max_active_adapters = 2
        self.max_running = 8
        self._running = running or {}
        self._active = active or {}
        self._waiting = waiting or {}
        self._resident = resident or {}

    def queued(self, worker):
        return self.loads.get(worker, 0) - self._running.get(worker, 0)

    def running(self, worker):
        return self._running.get(worker, 0)

    def running_adapters(self, worker):
        return self._active.get(worker, set())

    def waiting_adapters(self, worker):
        return self._waiting.get(worker, set())

    def resident_adapters(self, worker):
        return self._resident.get(worker, set())

    def workers_with_adapter(self, adapter_id):
        return {w for w, held in self._resident.items() if adapter_id in held}


def test_gie_lora_scores_follow_the_published_tiers():
    view = FakeView(
        ["a", "b", "c", "d"],
        active={"a": {"x"}, "c": {"p", "q"}, "d": {"p"}},
        waiting={"c": {"x"}, "d": {"q"}},
    )
    policy = GieLoraAffinityPolicy(random.Random(0))
    scores = [policy.lora_score("x", w, view) for w in "abcd"]
    # active; free capacity; waiting but full; full and not waiting.
    assert scores == [1.0, 0.8, 0.6, 0.0]


def test_gie_prefers_the_pod_with_the_adapter_active_when_loads_are_equal():
    view = FakeView(["a", "b"], active={"b": {"x"}})
    policy = GieLoraAffinityPolicy(random.Random(0))
    policy.set_workers(["a", "b"])
    assert {policy.choose("x", view) for _ in range(20)} == {"b"}


def test_ray_multiplex_routes_to_a_replica_holding_the_model():
    workers = ["a", "b", "c", "d"]
    view = FakeView(workers, resident={"a": {"m1"}, "b": {"m1", "m2"}, "c": {"m2"}, "d": set()})
    policy = RayMultiplexPolicy(random.Random(0))
    policy.set_workers(workers)
    assert {policy.choose("m1", view) for _ in range(30)} == {"a", "b"}
    # Unknown model: the replicas with the fewest loaded models (here only "d").
    assert {policy.choose("m9", view) for _ in range(30)} == {"d"}


def test_every_named_policy_builds_and_routes():
    view = FakeView(WORKERS)
    for name in POLICY_NAMES:
        policy = make_policy(name, WORKERS, seed=1)
        assert policy.choose("adapter-3", view) in WORKERS


def test_seeded_random_policy_is_reproducible():
    view = FakeView(WORKERS)
    one, two = make_policy("random", WORKERS, seed=5), make_policy("random", WORKERS, seed=5)
    picks = [one.choose("a", view) for _ in range(50)]
    assert picks == [two.choose("a", view) for _ in range(50)]
    assert len(set(picks)) > 1
