"""OpenTelemetry setup shared by every service.

Nothing is exported by default (no console spam). Traces and metrics go to an OTLP collector when
OTEL_EXPORTER_OTLP_ENDPOINT is set (the SDK's standard variables configure the exporter), and metrics
are exposed for Prometheus scraping when a metrics port is given. Trace context crosses NATS in
message headers (W3C traceparent), both through FastStream's middleware and the helpers below.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass

from opentelemetry import metrics, propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

log = logging.getLogger(__name__)


@dataclass
class Telemetry:
    service: str
    tracer_provider: TracerProvider
    meter_provider: MeterProvider
    prometheus_port: int | None = None
    metrics_server: object | None = None  # the /metrics HTTP server, stopped with the rest

    def tracer(self, name: str | None = None) -> trace.Tracer:
        return self.tracer_provider.get_tracer(name or self.service)

    def meter(self, name: str | None = None) -> metrics.Meter:
        return self.meter_provider.get_meter(name or self.service)

    def shutdown(self) -> None:
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()
        if self.metrics_server is not None:  # its port is free again (an in-process service in a test)
            self.metrics_server.shutdown()
            self.metrics_server.server_close()
            self.metrics_server = None


def setup_telemetry(
    service: str, *, metrics_port: int = 0, metrics_host: str = "0.0.0.0", set_global: bool = True
) -> Telemetry:
    resource = Resource.create({"service.name": f"loraplex-{service}", "service.namespace": "loraplex"})
    otlp = bool(os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"))

    tracer_provider = TracerProvider(resource=resource)
    if otlp:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))

    readers: list[MetricReader] = []
    if otlp:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

        readers.append(PeriodicExportingMetricReader(OTLPMetricExporter()))
    server = None
    if metrics_port:
        reader, server = _prometheus_reader(metrics_host, metrics_port)
        readers.append(reader)
    meter_provider = MeterProvider(resource=resource, metric_readers=readers)

    if set_global:
        trace.set_tracer_provider(tracer_provider)
        metrics.set_meter_provider(meter_provider)
    log.debug("telemetry ready", extra={"otlp": otlp, "metrics_port": metrics_port})
    return Telemetry(service, tracer_provider, meter_provider, metrics_port or None, server)


def _prometheus_reader(host: str, port: int) -> tuple[MetricReader, object]:
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from prometheus_client import start_http_server

    server, _thread = start_http_server(port, addr=host)
    return PrometheusMetricReader(), server


def inject_headers(headers: MutableMapping[str, str] | None = None, context: Context | None = None) -> dict:
    """Headers carrying the current trace context, for a raw nats-py publish."""
    carrier: dict[str, str] = dict(headers or {})
    propagate.inject(carrier, context=context)
    return carrier


def extract_context(headers: Mapping[str, str] | None) -> Context:
    """The trace context a message carried, to continue its trace in a consumer."""
    return propagate.extract(dict(headers or {}))
