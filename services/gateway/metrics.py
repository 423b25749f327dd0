"""The gateway's metrics (OpenTelemetry instruments; Prometheus on LPX_GATEWAY_METRICS_PORT)."""

from __future__ import annotations

from dataclasses import dataclass

from opentelemetry.metrics import CallbackOptions, Counter, Histogram, Meter, Observation, UpDownCounter

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


@dataclass
class GatewayMetrics:
    requests: Counter  # tenant, endpoint, status
    tokens: Counter  # tenant, kind (prompt / completion): what each tenant's answers used
    latency_s: Histogram  # tenant, endpoint
    ttft_s: Histogram  # tenant, endpoint
    routing: Counter  # pool, affinity_hit, spilled
    digest_mismatch: Counter  # tenant, pool, worker: an alert, never a silent success
    reroutes: Counter  # pool, reason
    duplicate_results: Counter  # results after the first for one request id (dropped)
    resolve_lookups: Counter  # outcome: hit, miss, refresh, negative, stale, unavailable
    submissions: Counter  # outcome
    in_flight: UpDownCounter
    stage_s: Histogram  # stage: services.gateway.timeline.STAGES
    throttled: Counter  # tenant, limit: requests refused with 429
    overload_refusals: Counter  # pool: refused at once, the pool could not finish them in time
    fair_wait_s: Histogram  # tenant, tier: time waited for a fair share of a full pool
    token_messages: Counter  # form: batch (one engine step of a worker) or single (one delta)
    token_gaps: Counter  # streams that missed a delta (core NATS lost it): the rest came with the result
    meter: Meter | None = None

    @classmethod
    def create(cls, meter: Meter) -> GatewayMetrics:
        def histogram(name: str, desc: str) -> Histogram:
            try:
                return meter.create_histogram(
                    name, unit="s", description=desc, explicit_bucket_boundaries_advisory=list(_LATENCY_BUCKETS)
                )
            except TypeError:  # older SDKs without advisory buckets
                return meter.create_histogram(name, unit="s", description=desc)

        return cls(
            meter=meter,
            requests=meter.create_counter("lpx_gateway_requests", description="requests by tenant and status"),
            tokens=meter.create_counter("lpx_gateway_tokens", description="tokens of answered requests, by tenant"),
            latency_s=histogram("lpx_gateway_request_latency", "end-to-end latency seen by the gateway"),
            ttft_s=histogram("lpx_gateway_ttft", "time to first token (streaming requests)"),
            routing=meter.create_counter("lpx_gateway_routing_decisions", description="affinity hits and spills"),
            digest_mismatch=meter.create_counter(
                "lpx_gateway_digest_mismatch", description="a worker applied another digest than resolved"
            ),
            reroutes=meter.create_counter("lpx_gateway_reroutes", description="requests re-routed after worker loss"),
            duplicate_results=meter.create_counter(
                "lpx_gateway_duplicate_results", description="later results for an answered request (dropped)"
            ),
            resolve_lookups=meter.create_counter("lpx_gateway_resolve_lookups", description="resolver cache outcomes"),
            submissions=meter.create_counter("lpx_gateway_submissions", description="async submissions by outcome"),
            in_flight=meter.create_up_down_counter("lpx_gateway_in_flight", description="requests awaiting results"),
            token_messages=meter.create_counter(
                "lpx_gateway_token_messages", description="streamed-token messages received, by form"
            ),
            token_gaps=meter.create_counter(
                "lpx_gateway_token_gaps",
                description="streams that missed a token delta; their rest was sent with the final result",
            ),
            stage_s=histogram("lpx_gateway_stage", "time per request stage, gateway accept to reply sent"),
            throttled=meter.create_counter("lpx_gateway_throttled", description="requests refused over a tenant limit"),
            fair_wait_s=histogram(
                "lpx_gateway_fair_wait",
                "time a request waited for its tenant's fair share of a full pool (a starved tenant shows here)",
            ),
            overload_refusals=meter.create_counter(
                "lpx_gateway_overload_refusals",
                description="requests refused early: the pool could not finish them before their deadline",
            ),
        )

    def observe_fair_queue(self, fair) -> None:
        """Gauges per pool and tenant waiting for a full pool's fair share (services.gateway.fairness):
        requests waiting, the oldest one's wait (grows for a starved tenant), and its share of the turns."""
        if self.meter is None:
            return

        def gauge(name: str, unit: str, desc: str, value) -> None:
            def observe(_: CallbackOptions):
                return [Observation(value(row), {"pool": row.pool, "tenant": row.tenant}) for row in fair.snapshot()]

            self.meter.create_observable_gauge(name, callbacks=[observe], unit=unit, description=desc)

        gauge("lpx_gateway_fair_waiting", "1", "requests waiting for a full pool's fair share", lambda r: r.waiting)
        oldest = "the oldest waiting request's wait (starvation shows here)"
        gauge("lpx_gateway_fair_oldest_wait", "s", oldest, lambda r: r.oldest_wait_s)
        share = "the tenant's share of the turns among the tenants waiting"
        gauge("lpx_gateway_fair_share", "1", share, lambda r: r.share)
