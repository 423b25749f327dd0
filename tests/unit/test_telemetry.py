import json
import logging

from opentelemetry.sdk.trace import TracerProvider

from libs.logs import JsonFormatter, _ContextFilter
from libs.telemetry import extract_context, inject_headers


def test_trace_context_survives_a_header_roundtrip():
    tracer = TracerProvider().get_tracer("t")
    with tracer.start_as_current_span("publish") as span:
        headers = inject_headers({"Nats-Msg-Id": "m1"})
    assert headers["Nats-Msg-Id"] == "m1" and "traceparent" in headers
    ctx = extract_context(headers)
    child = tracer.start_span("consume", context=ctx)
    assert child.get_span_context().trace_id == span.get_span_context().trace_id


def test_json_logs_carry_service_trace_and_extra_fields():
    tracer = TracerProvider().get_tracer("t")
    record = logging.LogRecord("lpx.test", logging.INFO, __file__, 1, "hello %s", ("world",), None)
    record.request_id = "r-1"
    with tracer.start_as_current_span("s") as span:
        _ContextFilter("gateway").filter(record)
    doc = json.loads(JsonFormatter().format(record))
    assert doc["msg"] == "hello world" and doc["service"] == "gateway" and doc["request_id"] == "r-1"
    assert doc["trace_id"] == format(span.get_span_context().trace_id, "032x")


def test_the_metrics_endpoint_stops_with_the_telemetry():
    import socket

    import httpx

    from libs.telemetry import setup_telemetry

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    telemetry = setup_telemetry("unit", metrics_port=port, set_global=False)
    telemetry.meter().create_counter("lpx_unit_things").add(1)
    assert "lpx_unit_things" in httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    telemetry.shutdown()
    try:
        httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2)
        raise AssertionError("the metrics server still answers after shutdown")
    except httpx.TransportError:
        pass


def test_the_metrics_endpoint_listens_where_its_settings_say():
    """`metrics_host` (LPX_<SERVICE>_METRICS_HOST): every interface by default (a pod), loopback for `lpx up`."""
    import socket

    from libs.settings import ServiceSettings
    from libs.telemetry import setup_telemetry

    assert ServiceSettings(_env_file=None).metrics_host == "0.0.0.0"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    telemetry = setup_telemetry("unit", metrics_port=port, metrics_host="127.0.0.1", set_global=False)
    try:
        assert telemetry.metrics_server.server_address[0] == "127.0.0.1"
    finally:
        telemetry.shutdown()
