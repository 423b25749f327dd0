"""bench_vs_vllm's verdicts: a ratio is a win or a loss only when every round agrees."""

import argparse

from benchmarks.vs_vllm_report import compare, ratio_markdown, report, verdict


def test_a_spread_that_straddles_one_is_a_tie():
    assert verdict(0.95, 1.04, higher_is_better=True) == "tie"
    assert verdict(1.01, 1.10, higher_is_better=True) == "win"
    assert verdict(0.80, 0.90, higher_is_better=True) == "loss"
    assert verdict(0.80, 0.90, higher_is_better=False) == "win"  # latency: lower is better
    assert verdict(0.9, 0.9, higher_is_better=True) == "n/a (1 round)"


def _run(tok_s: float, ttft: float, texts: list[str]) -> dict:
    samples = [{"text": t, "latency_s": 1.0, "ttft_s": ttft, "tokens": 4} for t in texts]
    return {"tok_per_s": tok_s, "latency_p50_s": 1.0, "latency_p95_s": 2.0, "ttft_p50_s": ttft, "samples": samples}


def test_each_round_is_compared_with_its_own_peer_run():
    mix, peer = "one adapter", "vllm serve, equal ops"
    rounds = [
        {peer: {mix: _run(50, 1.0, ["a", "b"])}, "loraplex": {mix: _run(55, 0.9, ["a", "b"])}},
        {peer: {mix: _run(40, 1.0, ["a", "b"])}, "loraplex": {mix: _run(38, 1.2, ["a", "x"])}},
    ]
    c = compare(rounds, mix, peer)
    assert c["throughput"]["rounds"] == [1.1, 0.95]
    assert c["throughput"]["verdict"] == "tie"
    assert c["TTFT p50"]["median"] == 1.05
    assert c["identical"] == "3/4"
    args = argparse.Namespace(requests=2, concurrency=2, tokens=4, rounds=2, worker_env={})
    rep = report(rounds, [mix], [peer, "loraplex"], args)
    assert "| one adapter | 1.02x [0.95-1.10] tie |" in ratio_markdown(rep, peer)


def test_cpu_seconds_are_told_per_1k_tokens_by_kind_of_process():
    from benchmarks.cpu_account import kind_of, spent
    from benchmarks.vs_vllm_report import cpu_markdown

    assert kind_of("VLLM::EngineCore", "", 7, 1) == "engine"
    assert kind_of("python", "python -m services.gateway", 7, 1) == "gateway"
    assert kind_of("python", "anything", 1, 1) == "bench client"
    before = {10: ("engine", 5.0), 11: ("nats", 1.0), 12: ("worker", 2.0)}
    after = {10: ("engine", 9.0), 11: ("nats", 1.5), 13: ("worker", 0.5)}  # 12 gone, 13 new
    assert spent(before, after) == {"engine": 4.0, "nats": 0.5, "worker": 0.5}

    mix, peer = "one adapter", "vllm serve, equal ops"
    lpx, vllm = _run(50, 1.0, ["a", "b"]), _run(50, 1.0, ["a", "b"])
    lpx.update(tokens=2000, cpu_s={"engine": 40.0, "gateway": 2.0})
    vllm.update(tokens=1000, cpu_s={"engine": 19.0, "vllm server": 1.0})
    args = argparse.Namespace(requests=2, concurrency=2, tokens=4, rounds=1, worker_env={})
    rep = report([{peer: {mix: vllm}, "loraplex": {mix: lpx}}], [mix], [peer, "loraplex"], args)
    table = cpu_markdown(rep)
    assert "| loraplex | gateway | 1.00 |" in table and "| loraplex | **all** | **21.00** |" in table
    assert f"| {peer} | **all** | **20.00** |" in table
