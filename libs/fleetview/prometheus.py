"""Per-tenant request rates by HTTP status from the gateways' Prometheus endpoints (`--metrics URL`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from prometheus_client.parser import text_string_to_metric_families

# services/gateway/metrics.py: `requests` (tenant, endpoint, status), a counter.
REQUESTS_SAMPLE = "lpx_gateway_requests_total"

Counts = dict[tuple[str, str], float]  # (tenant, status) -> requests


def tenant_status_counts(text: str) -> Counts:
    """(tenant, HTTP status) -> requests answered, over every endpoint, from one scrape."""
    counts: Counts = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name != REQUESTS_SAMPLE:
                continue
            key = (sample.labels.get("tenant", ""), sample.labels.get("status", ""))
            counts[key] = counts.get(key, 0.0) + sample.value
    return counts


def status_rates(before: Counts, after: Counts, seconds: float) -> dict[str, dict[str, float]]:
    """tenant -> {status: req/s} between two scrapes of one gateway. A count lower than before means
    the gateway restarted: all of it is new."""
    rates: dict[str, dict[str, float]] = {}
    if seconds <= 0:
        return rates
    for (tenant, status), now in after.items():
        then = before.get((tenant, status), 0.0)
        delta = now - then if now >= then else now
        rates.setdefault(tenant, {})[status] = delta / seconds
    return rates


def merged(parts: Iterable[Mapping[str, Mapping[str, float]]]) -> dict[str, dict[str, float]]:
    """The gateways' rates added up per tenant and status."""
    total: dict[str, dict[str, float]] = {}
    for part in parts:
        for tenant, statuses in part.items():
            row = total.setdefault(tenant, {})
            for status, rate in statuses.items():
                row[status] = row.get(status, 0.0) + rate
    return total
