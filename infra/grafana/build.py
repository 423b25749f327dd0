"""loraplex's Grafana dashboards as code: `python infra/grafana/build.py` writes dashboards/<uid>.json,
and the same files into the Helm chart (infra/k8s/loraplex/dashboards: Helm reads no file outside a chart).

The JSON files are committed (Grafana provisions them from infra/grafana/provisioning, the chart ships them
as ConfigMaps for Grafana's dashboard sidecar) and must equal what this script writes:
tests/unit/test_dashboards.py checks that, tests/integration/test_dashboards.py that every metric a
panel queries is really exported by a running service (or, for NATS, by prometheus-nats-exporter).

Metric names are the Prometheus names of the services' OpenTelemetry instruments (services/*/metrics.py):
a unit "s" adds `_seconds`, a counter `_total`, a histogram `_bucket`/`_sum`/`_count`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent / "dashboards"
CHART_OUT = Path(__file__).resolve().parents[1] / "k8s" / "loraplex" / "dashboards"  # byte-identical copies
DATASOURCE = {"type": "prometheus", "uid": "prometheus"}
RATE = "[$__rate_interval]"
# Worker series without a pool label take it from lpx_worker_info (one series per worker process).
BY_POOL = ' * on (instance) group_left (pool) lpx_worker_info{pool=~"$pool"}'


# --- panels --------------------------------------------------------------------------------------
def q(expr: str, legend: str = "") -> dict:
    return {"expr": expr, "legendFormat": legend}


def timeseries(title: str, *targets: dict, unit: str = "short", description: str = "", w: int = 12) -> dict:
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "targets": list(targets),
        "unit": unit,
        "w": w,
        "h": 8,
    }


def stat(title: str, *targets: dict, unit: str = "short", description: str = "", w: int = 6) -> dict:
    return {
        "type": "stat",
        "title": title,
        "description": description,
        "targets": list(targets),
        "unit": unit,
        "w": w,
        "h": 5,
    }


def bars(title: str, *targets: dict, unit: str = "short", description: str = "", w: int = 12) -> dict:
    """The latest value of each series as a bar (instant query): a top-N list."""
    return {
        "type": "bargauge",
        "title": title,
        "description": description,
        "targets": list(targets),
        "unit": unit,
        "w": w,
        "h": 8,
        "instant": True,
    }


def row(title: str) -> dict:
    return {"type": "row", "title": title}


def quantiles(metric: str, by: str = "", join: str = "", legend: str = "") -> list[dict]:
    """p50 and p95 of a histogram, per `by` labels (`join`: e.g. BY_POOL, for a pool label)."""
    labels = ", ".join(["le", *([by] if by else [])])
    inner = f"sum by ({labels}) (rate({metric}_bucket{RATE}){join})"
    return [q(f"histogram_quantile({p}, {inner})", f"p{round(p * 100)} {legend}".strip()) for p in (0.5, 0.95)]


def variable(name: str, metric: str, label: str) -> dict:
    query = f"label_values({metric}, {label})"
    return {
        "name": name,
        "label": name,
        "type": "query",
        "datasource": DATASOURCE,
        "definition": query,
        "query": {"query": query, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
        "includeAll": True,
        "multi": True,
        "allValue": ".*",
        "current": {},
        "refresh": 2,
        "sort": 1,
    }


# --- the dashboards ------------------------------------------------------------------------------
def fleet() -> dict:
    pool = '{pool=~"$pool"}'
    panels = [
        stat("Workers", q(f"count(lpx_worker_info{pool})"), description="worker processes scraped"),
        stat(
            "Scrape targets down",
            q('count(up{job=~"loraplex-.*"} == 0) or vector(0)'),
            description="loraplex processes Prometheus cannot scrape",
        ),
        stat("Requests in flight (gateways)", q("sum(lpx_gateway_in_flight)")),
        stat("Tokens / s", q(f"sum(lpx_worker_tokens_per_second{pool})"), unit="short"),
        timeseries("Workers per pool", q(f"count by (pool) (lpx_worker_info{pool})", "{{pool}}")),
        timeseries("In flight per pool (workers)", q(f"sum by (pool) (lpx_worker_in_flight{BY_POOL})", "{{pool}}")),
        timeseries(
            "Queue depth per pool",
            q(f"sum by (pool) (lpx_worker_queue_depth{pool})", "{{pool}}"),
            description="messages routed to the pool's workers and not yet taken",
        ),
        timeseries(
            "Tokens / s per pool",
            q(f"sum by (pool) (lpx_worker_tokens_per_second{pool})", "{{pool}}"),
            q(f"sum by (pool) (rate(lpx_worker_generated_tokens_total{RATE}){BY_POOL})", "{{pool}} (counted)"),
        ),
        timeseries(
            "TTFT at the workers",
            *quantiles("lpx_worker_ttft_seconds", "pool", join=BY_POOL, legend="{{pool}}"),
            unit="s",
            description="time to first token inside the worker",
        ),
        timeseries(
            "TTFT at the gateways (streaming)",
            *quantiles("lpx_gateway_ttft_seconds"),
            unit="s",
            description="time to first streamed token as the caller sees it",
        ),
        timeseries("Request latency at the gateways", *quantiles("lpx_gateway_request_latency_seconds"), unit="s"),
        timeseries(
            "Worker requests / s by outcome",
            q(f"sum by (outcome) (rate(lpx_worker_requests_total{RATE}))", "{{outcome}}"),
            unit="reqps",
        ),
        timeseries(
            "Affinity hit ratio per pool",
            q(
                f'sum by (pool) (rate(lpx_gateway_routing_decisions_total{{affinity_hit="true"}}{RATE})) '
                f"/ sum by (pool) (rate(lpx_gateway_routing_decisions_total{RATE}))",
                "{{pool}}",
            ),
            unit="percentunit",
            description="routed to a worker that already had the adapter",
        ),
        timeseries(
            "Async submissions / s by outcome",
            q(f"sum by (outcome) (rate(lpx_gateway_submissions_total{RATE}))", "{{outcome}}"),
            unit="reqps",
        ),
        timeseries(
            "Time per request stage (p95)",
            q(
                f"histogram_quantile(0.95, sum by (le, stage) (rate(lpx_gateway_stage_seconds_bucket{RATE})))",
                "{{stage}}",
            ),
            unit="s",
            w=24,
            description="gateway accept to reply sent, stage by stage (services/gateway/timeline.py)",
        ),
    ]
    return dashboard(
        "loraplex-fleet",
        "loraplex / Fleet",
        panels,
        [variable("pool", "lpx_worker_info", "pool")],
        "Workers per pool, load, throughput and time to first token.",
    )


def adapter_tiers() -> dict:
    hits, misses = (
        f"sum by (tier) (rate(lpx_worker_adapter_tier_{kind}_total{RATE}){BY_POOL})" for kind in ("hits", "misses")
    )
    pool = '{pool=~"$pool"}'
    panels = [
        timeseries(
            "Hit rate per tier",
            q(f"{hits} / (({hits} + {misses}) or {hits})", "{{tier}}"),
            unit="percentunit",
            description="requests that found their adapter at this tier, of those that looked there "
            "(hot to cold: gpu, cpu, disk, object_store; the coldest, object_store, always finds it)",
        ),
        timeseries(
            "Where adapters were found",
            q(hits, "{{tier}}"),
            unit="reqps",
            description="requests per second by the tier their adapter came from",
        ),
        timeseries(
            "Adapter load latency by source tier",
            *quantiles("lpx_worker_adapter_load_seconds", "tier", join=BY_POOL, legend="{{tier}}"),
            unit="s",
            description="time to make an adapter usable, by the tier it was found at",
        ),
        timeseries(
            "Evictions / s per tier",
            q(f"sum by (tier) (rate(lpx_worker_adapter_evictions_total{pool}{RATE}))", "{{tier}}"),
            description="adapters leaving an engine slot (gpu), the host-RAM cache (cpu) or the disk cache",
        ),
        bars(
            "Hottest adapters (requests / s)",
            q(f"topk(10, sum by (adapter) (rate(lpx_worker_adapter_requests_total{pool}[5m])))", "{{adapter}}"),
            unit="reqps",
            description="digest prefixes; each worker exports its 10 hottest adapters",
        ),
        timeseries(
            "Adapter slot swaps / s",
            q(f"sum by (pool) (rate(lpx_worker_adapter_slot_swaps_total{pool}{RATE}))", "{{pool}}"),
            description="engine slots handed to an adapter that did not hold one",
        ),
        timeseries(
            "Wait for an adapter slot",
            *quantiles("lpx_worker_admission_wait_seconds", "pool", join=BY_POOL, legend="{{pool}}"),
            q(f"max by (pool) (lpx_worker_admission_oldest_wait_seconds{pool})", "oldest waiting {{pool}}"),
            unit="s",
        ),
        timeseries("Disk cache size per worker", q(f"lpx_worker_disk_cache_bytes{pool}", "{{worker}}"), unit="bytes"),
        timeseries(
            "Alias resolution at the gateways",
            q(f"sum by (outcome) (rate(lpx_gateway_resolve_lookups_total{RATE}))", "{{outcome}}"),
            unit="reqps",
            description="resolver cache: hit, miss, negative, stale, unavailable",
        ),
    ]
    return dashboard(
        "loraplex-adapter-tiers",
        "loraplex / Adapter tiers",
        panels,
        [variable("pool", "lpx_worker_info", "pool")],
        "Where adapters are found (gpu, cpu, disk, object store), how long loads take, evictions "
        "and the hottest adapters.",
    )


def tenants() -> dict:
    t = 'tenant=~"$tenant"'
    requests = f"lpx_gateway_requests_total{{{t}}}"
    errors = f'lpx_gateway_requests_total{{{t}, status!~"2.."}}'
    panels = [
        timeseries(
            "Requests / s per tenant", q(f"sum by (tenant) (rate({requests}{RATE}))", "{{tenant}}"), unit="reqps"
        ),
        timeseries(
            "Tokens / s per tenant",
            q(f"sum by (tenant, kind) (rate(lpx_gateway_tokens_total{{{t}}}{RATE}))", "{{tenant}} {{kind}}"),
            description="prompt and completion tokens of answered requests",
        ),
        timeseries(
            "Error ratio per tenant",
            q(f"sum by (tenant) (rate({errors}{RATE})) / sum by (tenant) (rate({requests}{RATE}))", "{{tenant}}"),
            unit="percentunit",
            description="answers other than 2xx",
        ),
        timeseries(
            "Errors / s by status",
            q(f"sum by (tenant, status) (rate({errors}{RATE}))", "{{tenant}} {{status}}"),
            unit="reqps",
        ),
        timeseries(
            "Throttled / s per tenant",
            q(f"sum by (tenant, limit) (rate(lpx_gateway_throttled_total{{{t}}}{RATE}))", "{{tenant}} {{limit}}"),
            unit="reqps",
            description="requests refused with 429 over the tenant's rps, tpm or concurrency limit",
        ),
        timeseries(
            "Latency p95 per tenant",
            q(
                f"histogram_quantile(0.95, sum by (le, tenant) "
                f"(rate(lpx_gateway_request_latency_seconds_bucket{{{t}}}{RATE})))",
                "{{tenant}}",
            ),
            unit="s",
        ),
        bars(
            "Busiest tenants (requests in range)",
            q(f"topk(10, sum by (tenant) (increase({requests}[$__range])))", "{{tenant}}"),
        ),
        bars(
            "Most tokens (in range)",
            q(f"topk(10, sum by (tenant) (increase(lpx_gateway_tokens_total{{{t}}}[$__range])))", "{{tenant}}"),
        ),
    ]
    return dashboard(
        "loraplex-tenants",
        "loraplex / Tenants",
        panels,
        [variable("tenant", "lpx_gateway_requests_total", "tenant")],
        "Per tenant at the gateways: requests, tokens, errors and throttling.",
    )


def eval_and_training() -> dict:
    panels = [
        row("Eval gate"),
        stat(
            "Verdicts in range",
            q("sum by (outcome) (increase(lpx_eval_gate_evaluations_total[$__range]))", "{{outcome}}"),
            w=8,
        ),
        stat("Evaluations running", q("sum(lpx_eval_gate_running)"), w=8),
        stat(
            "Events queued",
            q("sum(lpx_eval_gate_queued)"),
            w=8,
            description="registry events waiting for the gates' consumers",
        ),
        timeseries("Verdicts / s", q(f"sum by (outcome) (rate(lpx_eval_gate_evaluations_total{RATE}))", "{{outcome}}")),
        timeseries(
            "Evaluation duration",
            *quantiles("lpx_eval_gate_duration_seconds", "outcome", legend="{{outcome}}"),
            unit="s",
            description="claim to verdict",
        ),
        bars(
            "Rejections by check (in range)",
            q("sum by (check) (increase(lpx_eval_gate_check_failures_total[$__range]))", "{{check}}"),
            description="the check that decided each rejection",
        ),
        timeseries(
            "Events skipped / s",
            q(f"sum by (reason) (rate(lpx_eval_gate_skipped_total{RATE}))", "{{reason}}"),
            description="events the gate did not evaluate, and why",
        ),
        timeseries("Queue per gate", q("lpx_eval_gate_queued", "{{gate}}")),
        row("Trainer"),
        stat("Jobs in range", q("sum by (outcome) (increase(lpx_trainer_jobs_total[$__range]))", "{{outcome}}"), w=8),
        stat("Jobs training", q("sum(lpx_trainer_running)"), w=8),
        stat(
            "Jobs queued",
            q("max(lpx_trainer_queued)"),
            w=8,
            description="the work queue's backlog (every trainer sees the same queue)",
        ),
        timeseries("Job duration", *quantiles("lpx_trainer_job_seconds", "outcome", legend="{{outcome}}"), unit="s"),
        timeseries("Optimizer steps / s", q(f"sum(rate(lpx_trainer_steps_total{RATE}))", "steps")),
        timeseries(
            "Mean final loss",
            q("sum(rate(lpx_trainer_final_loss_sum[1h])) / sum(rate(lpx_trainer_final_loss_count[1h]))", "last hour"),
            description="training loss at each job's last step",
        ),
        timeseries(
            "Jobs queued and training",
            q("max(lpx_trainer_queued)", "queued"),
            q("sum(lpx_trainer_running)", "training"),
        ),
    ]
    return dashboard(
        "loraplex-eval-trainer",
        "loraplex / Eval gate and trainer",
        panels,
        [],
        "Verdicts, evaluation and training durations, queues.",
    )


def nats() -> dict:
    # prometheus-nats-exporter's names: gnatsd_varz_<field of /varz>, jetstream_* from /jsz (compose.yaml).
    panels = [
        stat("Connections", q("sum(gnatsd_varz_connections)")),
        stat("Slow consumers", q("sum(gnatsd_varz_slow_consumers)")),
        stat("JetStream storage", q("sum(gnatsd_varz_jetstream_stats_storage)"), unit="bytes"),
        stat("Exporter up", q('up{job="nats"}')),
        timeseries(
            "Messages / s",
            q(f"sum(rate(gnatsd_varz_in_msgs{RATE}))", "in"),
            q(f"sum(rate(gnatsd_varz_out_msgs{RATE}))", "out"),
        ),
        timeseries(
            "Bytes / s",
            q(f"sum(rate(gnatsd_varz_in_bytes{RATE}))", "in"),
            q(f"sum(rate(gnatsd_varz_out_bytes{RATE}))", "out"),
            unit="Bps",
        ),
        timeseries("Stream messages", q("sum by (stream_name) (jetstream_stream_total_messages)", "{{stream_name}}")),
        timeseries(
            "Stream bytes", q("sum by (stream_name) (jetstream_stream_total_bytes)", "{{stream_name}}"), unit="bytes"
        ),
        timeseries(
            "Consumers: pending",
            q(
                "topk(15, sum by (stream_name, consumer_name) (jetstream_consumer_num_pending))",
                "{{stream_name}} / {{consumer_name}}",
            ),
            description="messages not yet delivered (a worker's, a gate's or the trainers' backlog)",
        ),
        timeseries(
            "Consumers: awaiting ack",
            q(
                "topk(15, sum by (stream_name, consumer_name) (jetstream_consumer_num_ack_pending))",
                "{{stream_name}} / {{consumer_name}}",
            ),
        ),
        timeseries(
            "Redeliveries",
            q(
                "topk(15, sum by (stream_name, consumer_name) (jetstream_consumer_num_redelivered))",
                "{{stream_name}} / {{consumer_name}}",
            ),
        ),
        timeseries(
            "Server memory and CPU", q("sum(gnatsd_varz_mem)", "memory bytes"), q("sum(gnatsd_varz_cpu)", "cpu %")
        ),
    ]
    return dashboard(
        "loraplex-nats",
        "loraplex / NATS",
        panels,
        [],
        "The NATS server: connections, traffic, JetStream streams and consumers (through prometheus-nats-exporter).",
    )


DASHBOARDS = (fleet, adapter_tiers, tenants, eval_and_training, nats)


# --- Grafana's JSON ------------------------------------------------------------------------------
def dashboard(uid: str, title: str, panels: list[dict], variables: list[dict], description: str) -> dict:
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["loraplex"],
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-1h", "to": "now"},
        "timezone": "browser",
        "annotations": {"list": []},
        "templating": {"list": variables},
        "panels": _layout(panels),
    }


def _layout(specs: list[dict]) -> list[dict]:
    """Ids in order and grid positions left to right, top to bottom on Grafana's 24 columns."""
    panels, x, y, line_h = [], 0, 0, 0
    for pid, spec in enumerate(specs, start=1):
        if spec["type"] == "row":
            y += line_h
            panels.append(
                {
                    "id": pid,
                    "type": "row",
                    "title": spec["title"],
                    "collapsed": False,
                    "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                    "panels": [],
                }
            )
            x, y, line_h = 0, y + 1, 0
            continue
        if x + spec["w"] > 24:
            x, y, line_h = 0, y + line_h, 0
        panels.append(_panel(pid, spec, {"h": spec["h"], "w": spec["w"], "x": x, "y": y}))
        x, line_h = x + spec["w"], max(line_h, spec["h"])
    return panels


def _panel(pid: int, spec: dict, grid: dict) -> dict:
    instant = spec.get("instant", False)
    targets = [
        {
            "refId": chr(ord("A") + i),
            "datasource": DATASOURCE,
            "expr": t["expr"],
            "legendFormat": t["legendFormat"],
            "instant": instant,
            "range": not instant,
        }
        for i, t in enumerate(spec["targets"])
    ]
    panel = {
        "id": pid,
        "type": spec["type"],
        "title": spec["title"],
        "description": spec["description"],
        "datasource": DATASOURCE,
        "gridPos": grid,
        "targets": targets,
        "fieldConfig": {"defaults": {"unit": spec["unit"]}, "overrides": []},
    }
    if spec["type"] == "stat":
        panel["options"] = {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value",
            "graphMode": "area",
            "textMode": "auto",
        }
    elif spec["type"] == "bargauge":
        panel["options"] = {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "orientation": "horizontal",
            "displayMode": "basic",
            "showUnfilled": True,
        }
    else:
        panel["options"] = {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        }
    return panel


def render(board: dict) -> str:
    return json.dumps(board, indent=2, sort_keys=False) + "\n"


def build() -> dict[str, str]:
    """File name -> content of every dashboard."""
    boards = [make() for make in DASHBOARDS]
    return {f"{board['uid']}.json": render(board) for board in boards}


def main() -> int:
    files = build()
    for out in (OUT, CHART_OUT):
        out.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (out / name).write_text(text)
        for stale in set(p.name for p in out.glob("*.json")) - set(files):
            (out / stale).unlink()
        print(f"wrote {len(files)} dashboards to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
