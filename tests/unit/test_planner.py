"""The capacity planner, checked from first principles on the reference deployment (BRIEF.md section 2)."""

from __future__ import annotations

import json
import math

import pytest
import typer
from typer.testing import CliRunner

from libs.cli import plan as plan_cli
from libs.planner import PlanInputs, gpus_needed, make_plan, make_variants

# Reference shapes (Llama-3.1-8B) and inputs, restated here so every expectation is computed by hand.
H, KV, MLP, LAYERS, VOCAB = 4096, 1024, 14336, 32, 128256
BF16 = 2
RANK16_BYTES = 16 * (2 * (H + H) + 2 * (H + KV) + 3 * (H + MLP)) * LAYERS * BF16
ADAPTERS, RPS, TOKENS, TOK_S, UTIL, PRICE, HOT = 2000, 500, 300, 5000, 0.75, 2.50, 100
HOURS_PER_MONTH = 365 * 24 / 12
HOST_RAM, GPU_MEM = 256e9, 80e9


@pytest.fixture(scope="module")
def reference():
    return make_plan()


@pytest.fixture(scope="module")
def variants():
    return {plan.name: plan for plan in make_variants()}


def test_adapter_bytes(reference):
    assert reference.adapter.bytes == RANK16_BYTES == 83_886_080


def test_memory_for_all_adapters_and_the_hot_set(reference):
    m = reference.memory
    assert m.all_adapters_bytes == ADAPTERS * RANK16_BYTES
    assert m.hot_set_bytes_per_gpu == HOT * RANK16_BYTES
    assert m.hot_set_fraction_of_gpu == pytest.approx(HOT * RANK16_BYTES / GPU_MEM)
    base = (LAYERS * (2 * H * H + 2 * H * KV + 3 * H * MLP + 2 * H) + 2 * VOCAB * H + H) * BF16
    assert m.base_weights_bytes == base
    assert m.gpu_bytes_left_for_kv_cache == GPU_MEM - base - HOT * RANK16_BYTES
    assert m.all_fit_host_ram is (ADAPTERS * RANK16_BYTES <= HOST_RAM)
    assert m.all_fit_host_ram


def test_load_time_per_tier(reference):
    t = reference.load_times
    assert t.host_to_gpu_s == pytest.approx(RANK16_BYTES / 25e9)  # ~3.4 ms over PCIe Gen5
    assert t.nvme_to_gpu_s == pytest.approx(RANK16_BYTES / 7e9 + RANK16_BYTES / 25e9)
    assert t.object_store_to_gpu_s_min == pytest.approx(0.5 + RANK16_BYTES / 25e9)
    assert t.object_store_to_gpu_s_max == pytest.approx(1.5 + RANK16_BYTES / 25e9)


def test_gpus_with_headroom_and_monthly_cost(reference):
    tok_s = RPS * TOKENS  # 150,000 output tok/s
    gpus = math.ceil(tok_s / TOK_S / UTIL)  # 30 GPUs of work at 75% busy -> 40
    assert reference.capacity.output_tok_s == tok_s
    assert reference.capacity.gpus_at_full_load == pytest.approx(tok_s / TOK_S)
    assert reference.capacity.gpus_needed == gpus == 40
    assert reference.cost.monthly_cost == pytest.approx(gpus * PRICE * HOURS_PER_MONTH)
    assert reference.cost.cost_per_adapter_month == pytest.approx(gpus * PRICE * HOURS_PER_MONTH / ADAPTERS)


def test_zipf_skew_puts_the_stated_share_on_the_hot_set(reference):
    assert reference.capacity.hot_set_traffic_share == pytest.approx(0.80, abs=1e-6)
    assert 1.0 < reference.capacity.zipf_exponent < 1.5


def test_dedicated_gpu_per_tenant_comparison(reference):
    d = reference.dedicated
    top_tenant_tok_s = reference.capacity.top_adapter_traffic_share * RPS * TOKENS
    # Every tenant needs at least one GPU; the hottest needs enough for its own traffic.
    assert d.gpus >= ADAPTERS + math.ceil(top_tenant_tok_s / (TOK_S * UTIL)) - 1
    assert d.tenants_needing_more_than_one_gpu >= 1
    assert d.monthly_cost == pytest.approx(d.gpus * PRICE * HOURS_PER_MONTH)
    assert d.cost_ratio_vs_pool == pytest.approx(d.gpus / reference.capacity.gpus_needed)
    assert d.cost_ratio_vs_pool > 45  # the brief's "~50x"


def test_rank_64_variant(variants):
    plan = variants["rank 64"]
    assert plan.adapter.bytes == 4 * RANK16_BYTES
    assert plan.memory.all_adapters_bytes == ADAPTERS * 4 * RANK16_BYTES
    assert plan.memory.all_fit_host_ram is (ADAPTERS * 4 * RANK16_BYTES <= HOST_RAM)
    assert plan.memory.adapters_fitting_host_ram == int(HOST_RAM // (4 * RANK16_BYTES))


def test_twenty_thousand_adapters_overflow_host_ram_into_nvme(variants):
    plan = variants["20,000 adapters + NVMe tier"]
    fitting = int(HOST_RAM // RANK16_BYTES)
    assert not plan.memory.all_fit_host_ram
    assert plan.memory.adapters_fitting_host_ram == fitting
    assert plan.memory.adapters_not_fitting_host_ram == 20_000 - fitting
    assert plan.memory.bytes_not_fitting_host_ram == (20_000 - fitting) * RANK16_BYTES
    assert plan.memory.overflow_fits_nvme is ((20_000 - fitting) * RANK16_BYTES <= 3840e9)
    # Affinity routing: a worker holds only its ring share.
    assert plan.memory.affinity_share_adapters_per_worker == math.ceil(20_000 / 40)


def test_attention_only_rank_8_variant(variants):
    plan = variants["20,000 adapters, attention-only rank 8"]
    each = 8 * (2 * (H + H) + 2 * (H + KV)) * LAYERS * BF16
    assert plan.adapter.bytes == each
    assert plan.memory.all_adapters_bytes == 20_000 * each
    assert plan.memory.adapters_not_fitting_host_ram == max(0, 20_000 - int(HOST_RAM // each))
    assert plan.capacity.gpus_needed == 40  # throughput-bound: adapter size does not change GPU count


def test_any_hugging_face_config_path(tmp_path):
    config = {
        "num_hidden_layers": 4,
        "hidden_size": 256,
        "intermediate_size": 1024,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "vocab_size": 5000,
        "torch_dtype": "float32",
        "tie_word_embeddings": True,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    plan = make_plan(PlanInputs(base=str(path), rank=4, targets="q,v"))
    assert plan.adapter.bytes == 4 * ((256 + 256) + (256 + 256)) * 4 * 4
    tied_params = 4 * (4 * 256 * 256 + 3 * 256 * 1024 + 2 * 256) + 5000 * 256 + 256
    assert plan.memory.base_weights_bytes == tied_params * 4
    # A model directory works as well as the config.json inside it.
    assert make_plan(PlanInputs(base=str(tmp_path), rank=4, targets="q,v")).adapter == plan.adapter


def test_gpus_needed_rounds_up_but_not_on_float_noise():
    assert gpus_needed(150_000, 5000, 0.75) == 40
    assert gpus_needed(150_001, 5000, 0.75) == 41
    assert gpus_needed(0.3 * 3, 0.9, 1.0) == 1


@pytest.mark.parametrize(
    "changes", [{"rank": 0}, {"target_utilization": 0}, {"targets": "nope"}, {"object_store_fetch_s_min": 2.0}]
)
def test_invalid_inputs_are_rejected(changes):
    with pytest.raises(ValueError):
        PlanInputs(**changes)


def _cli() -> typer.Typer:
    app = typer.Typer()
    plan_cli.register(app)

    @app.command("noop", hidden=True)
    def _noop() -> None:  # a second command keeps typer from collapsing the app into `plan`
        pass

    return app


def test_plan_command_prints_json():
    result = CliRunner().invoke(_cli(), ["plan", "--json", "--rank", "8", "--targets", "attention"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["plan"]["adapter"]["bytes"] == 8 * (2 * (H + H) + 2 * (H + KV)) * LAYERS * BF16
    assert len(data["variants"]) == 3


def test_plan_command_renders_tables_and_rejects_bad_input():
    runner = CliRunner()
    result = runner.invoke(_cli(), ["plan"])
    assert result.exit_code == 0, result.output
    assert "83,886,080" in result.output
    assert runner.invoke(_cli(), ["plan", "--targets", "bogus"]).exit_code != 0


# --- base-model upgrade budget and cost per token (by hand from the inputs) ----------------------
PARAMS_8B = LAYERS * (2 * H * H + 2 * H * KV + 3 * H * MLP + 2 * H) + 2 * VOCAB * H + H
GPUS = math.ceil(RPS * TOKENS / TOK_S / UTIL)  # 40


def test_upgrade_budget_assumed_and_from_flops(reference):
    u = reference.upgrade
    assert u.assumed_gpu_hours == ADAPTERS * 0.5 == 1000  # the brief: 2,000 adapters x 0.5 GPU-h
    assert u.assumed_cost == 1000 * PRICE == 2500
    assert u.base_params == PARAMS_8B
    per_adapter_h = (6 * PARAMS_8B * 2_000_000 / (989e12 * 0.35) + 60) / 3600
    assert u.flops_per_adapter == 6 * PARAMS_8B * 2_000_000
    assert u.flops_gpu_hours_per_adapter == pytest.approx(per_adapter_h)
    assert u.flops_gpu_hours == pytest.approx(ADAPTERS * per_adapter_h)
    assert u.flops_cost == pytest.approx(ADAPTERS * per_adapter_h * PRICE)
    period_h = ADAPTERS * per_adapter_h / 8  # on the 8 training GPUs
    assert u.side_by_side_hours == pytest.approx(period_h)
    assert u.side_by_side_gpu_hours == pytest.approx(period_h * GPUS)
    assert u.side_by_side_cost == pytest.approx(period_h * GPUS * PRICE)
    assert "0.5 GPU-h per adapter" in u.assumptions and "35% of 989 TFLOP/s" in u.assumptions


def test_upgrade_budget_follows_its_inputs():
    plan = make_plan(
        PlanInputs(
            adapters=500,
            dataset_tokens=10_000_000,
            price_per_gpu_hour=4.0,
            training_gpus=2,
            assumed_gpu_hours_per_adapter=1.0,
        )
    )
    per_adapter_h = (6 * PARAMS_8B * 10_000_000 / (989e12 * 0.35) + 60) / 3600
    assert plan.upgrade.assumed_cost == 500 * 1.0 * 4.0
    assert plan.upgrade.flops_cost == pytest.approx(500 * per_adapter_h * 4.0)
    assert plan.upgrade.side_by_side_hours == pytest.approx(500 * per_adapter_h / 2)


def test_cost_per_million_output_tokens_pool_and_dedicated(reference):
    t = reference.token_cost
    million_tokens_per_hour = RPS * TOKENS * 3600 / 1e6  # 540
    assert t.throughput_source == "assumed"
    assert t.pool_per_million_output_tokens == pytest.approx(GPUS * PRICE / million_tokens_per_hour)  # $0.185
    assert t.dedicated_per_million_output_tokens == pytest.approx(
        reference.dedicated.gpus * PRICE / million_tokens_per_hour
    )
    assert t.dedicated_over_pool == pytest.approx(reference.dedicated.gpus / GPUS)


def test_variants_carry_the_new_figures(variants):
    many = variants["20,000 adapters + NVMe tier"]
    assert many.upgrade.assumed_gpu_hours == 20_000 * 0.5
    small = variants["20,000 adapters, attention-only rank 8"]
    # Retraining cost comes from the base model, not the adapter: same FLOPs per adapter.
    assert small.upgrade.flops_gpu_hours == pytest.approx(many.upgrade.flops_gpu_hours)
    assert variants["rank 64"].token_cost.pool_per_million_output_tokens > 0


def test_measured_throughput_from_the_worker_benchmark(tmp_path):
    report = tmp_path / "worker.json"
    report.write_text(json.dumps({"throughput": {"mixed_adapters": {"tok_per_s": 2500.0}}}))
    result = CliRunner().invoke(_cli(), ["plan", "--json", "--no-variants", "--measured-bench", str(report)])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)["plan"]
    gpus = math.ceil(RPS * TOKENS / 2500 / UTIL)  # 80 GPUs at the measured rate
    assert plan["capacity"]["gpus_needed"] == gpus
    assert plan["token_cost"]["throughput_source"] == "measured: worker.json"
    assert plan["token_cost"]["pool_per_million_output_tokens"] == pytest.approx(gpus * PRICE / 540)
    bad = tmp_path / "other.json"
    bad.write_text("{}")
    refused = CliRunner().invoke(_cli(), ["plan", "--measured-bench", str(bad)])
    assert refused.exit_code != 0 and "throughput.mixed_adapters.tok_per_s" in refused.output


def test_upgrade_flags_change_the_json():
    result = CliRunner().invoke(
        _cli(),
        ["plan", "--json", "--no-variants", "--adapters", "500", "--gpu-hour-usd", "3", "--dataset-tokens", "1000000"],
    )
    assert result.exit_code == 0, result.output
    u = json.loads(result.output)["plan"]["upgrade"]
    assert u["assumed_cost"] == 500 * 0.5 * 3
    assert u["dataset_tokens_per_adapter"] == 1_000_000
