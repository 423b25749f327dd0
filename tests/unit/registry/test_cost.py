"""Cost estimates in usage reports (services/registry/cost.py): each input labelled measured,
configured or assumed; a throughput report that cannot be used is said, not silently replaced."""

from __future__ import annotations

import json

import pytest

from libs.planner.inputs import PlanInputs
from services.registry.cost import cost_basis
from services.registry.settings import RegistrySettings


def settings(**values) -> RegistrySettings:
    return RegistrySettings(_env_file=None, **values)


def test_without_configuration_both_figures_are_the_planners_assumptions():
    basis = cost_basis(settings())
    planner = PlanInputs()
    assert (basis.gpu_price_per_hour, basis.tok_s_per_gpu) == (planner.price_per_gpu_hour, planner.tok_s_per_gpu)
    assert basis.gpu_price_source.startswith("assumed") and basis.tok_s_source.startswith("assumed")


def test_a_measured_throughput_and_a_configured_price_give_dollars_per_million_tokens(tmp_path):
    report = tmp_path / "worker.json"
    report.write_text(json.dumps({"throughput": {"mixed_adapters": {"tok_per_s": 400.0}}}))
    basis = cost_basis(settings(gpu_price_per_hour=3.6, throughput_report=str(report)))
    assert basis.gpu_price_source == "configured" and basis.tok_s_source == f"measured: {report}"
    assert basis.usd_per_million_tokens == pytest.approx(3.6 / (400 * 3600) * 1e6)  # $2.50 per 1M tokens
    assert basis.usd(2_000_000) == pytest.approx(5.0)


def test_an_unusable_report_falls_back_to_the_assumption_and_says_why(tmp_path):
    report = tmp_path / "worker.json"
    report.write_text("{}")
    basis = cost_basis(settings(throughput_report=str(report)))
    assert basis.tok_s_per_gpu == PlanInputs().tok_s_per_gpu
    assert basis.tok_s_source.startswith("assumed") and "not usable" in basis.tok_s_source


@pytest.mark.parametrize("price", [0, -1, 1e9])
def test_a_zero_negative_or_absurd_price_is_refused(price):
    with pytest.raises(ValueError):
        settings(gpu_price_per_hour=price)
