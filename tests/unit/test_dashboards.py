"""The Grafana dashboards (infra/grafana, and their copies in the Helm chart) are well-formed and exactly what
their generator writes. That every metric they query is exported is checked on running services:
tests/integration/test_dashboards.py."""

from __future__ import annotations

import pytest

from tests.promql import DASHBOARDS, SYNTHETIC, load_dashboards, load_generator, matched_labels, metric_names, queries

WANTED = {"loraplex-fleet", "loraplex-adapter-tiers", "loraplex-tenants", "loraplex-eval-trainer", "loraplex-nats"}
DATASOURCE = {"type": "prometheus", "uid": "prometheus"}  # infra/grafana/provisioning/datasources
# The chart's copies (Helm reads no file outside the chart): templates/monitoring.yaml makes ConfigMaps of them.
CHART_DASHBOARDS = DASHBOARDS.parents[1] / "k8s" / "loraplex" / "dashboards"


@pytest.fixture(scope="module")
def boards() -> dict[str, dict]:
    return load_dashboards()


@pytest.mark.parametrize("folder", [DASHBOARDS, CHART_DASHBOARDS], ids=["grafana", "chart"])
def test_committed_json_is_what_the_generator_writes(boards, folder):
    built = load_generator().build()
    assert set(built) == set(boards), "run: python infra/grafana/build.py"
    assert {path.name for path in folder.glob("*.json")} == set(built), f"{folder}: run python infra/grafana/build.py"
    for name, text in built.items():
        assert (folder / name).read_text() == text, f"{folder / name} is stale: run python infra/grafana/build.py"


def test_one_dashboard_per_area_each_with_a_unique_uid(boards):
    uids = [board["uid"] for board in boards.values()]
    assert sorted(uids) == sorted(WANTED)
    for name, board in boards.items():
        assert name == f"{board['uid']}.json" and board["title"] and board["schemaVersion"] >= 36


def test_panels_are_well_formed(boards):
    for name, board in boards.items():
        ids = [panel["id"] for panel in board["panels"]]
        assert len(ids) == len(set(ids)), f"{name}: duplicate panel ids"
        cells: set[tuple[int, int]] = set()
        for panel in board["panels"]:
            where = f"{name} / {panel['title']}"
            grid = panel["gridPos"]
            assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24 and grid["h"] > 0, where
            mine = {
                (x, y) for x in range(grid["x"], grid["x"] + grid["w"]) for y in range(grid["y"], grid["y"] + grid["h"])
            }
            assert not cells & mine, f"{where} overlaps another panel"
            cells |= mine
            if panel["type"] == "row":
                continue
            assert panel["datasource"] == DATASOURCE, where
            assert panel["targets"], f"{where} has no query"
            refs = [target["refId"] for target in panel["targets"]]
            assert len(refs) == len(set(refs)), where
            for target in panel["targets"]:
                assert target["datasource"] == DATASOURCE and target["expr"].strip(), where
        for var in board["templating"]["list"]:
            assert var["datasource"] == DATASOURCE, f"{name}: variable {var['name']}"


def test_every_query_names_known_metrics(boards):
    """Service metrics are lpx_*, NATS' come from prometheus-nats-exporter; nothing else is scraped."""
    for name, board in boards.items():
        for query in queries(name, board):
            names = metric_names(query.expr)
            assert names, f"{name} / {query.panel}: no metric in {query.expr!r}"
            for metric in names - SYNTHETIC:
                assert metric.startswith(("lpx_", "gnatsd_", "jetstream_")), f"{name} / {query.panel}: {metric}"


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('sum by (pool) (rate(lpx_a_total{pool=~"$pool"}[$__rate_interval]))', {"lpx_a_total"}),
        (
            "histogram_quantile(0.95, sum by (le) (rate(x_bucket[5m]) * on (instance) group_left (pool) info))",
            {"x_bucket", "info"},
        ),
        ('count(up{job=~"loraplex-.*"} == 0) or vector(0)', {"up"}),
        ("a_sum / ignoring (tier) group_left b_count", {"a_sum", "b_count"}),
        ('topk(10, sum without (x) (increase(c{s!~"2.."}[1h] offset 5m)))', {"c"}),
    ],
)
def test_metric_names_are_read_out_of_promql(expr, names):
    assert metric_names(expr) == names


def test_label_matchers_are_read_out_of_promql():
    expr = 'sum(rate(a{tenant=~"$t", status!~"2.."}[5m])) / sum(b{x="}"})'
    assert matched_labels(expr) == {"a": {"tenant", "status"}, "b": {"x"}}
