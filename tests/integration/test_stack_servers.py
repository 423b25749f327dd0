"""The three servers the launcher started are real and usable by the platform's clients."""

from __future__ import annotations

import asyncio
import io
import uuid

import pytest

pytestmark = pytest.mark.integration


def test_status_reports_three_healthy_servers(stack):
    rows = {row.name: row for row in stack.status()}
    assert set(rows) == {"nats", "postgres", "s3"}
    assert all(row.healthy and row.pid for row in rows.values())
    assert "***@" in rows["postgres"].endpoint  # the password is not shown


def test_env_file_has_every_connection_setting(stack, connections):
    body = stack.env_file.read_text()
    for key in ("LPX_NATS_URL", "LPX_PG_DSN", "LPX_S3_ENDPOINT", "LPX_S3_ACCESS_KEY", "LPX_S3_SECRET_KEY"):
        assert f"{key}=" in body
    assert "LPX_NATS_URL=nats://127.0.0.1:" in body  # the env file's URL carries no credentials
    assert "LPX_NATS_PASSWORDS=" in body and "LPX_REGISTRY_NATS_CALLOUT_SEED=SA" in body
    assert connections.nats_url.startswith("nats://admin:")  # the tests' own connections: the operator


async def test_jetstream_streams_exist_with_declared_retention(connections):
    import nats

    from libs.contracts import subjects

    nc = await nats.connect(connections.nats_url)
    try:
        js = nc.jetstream()
        for spec in subjects.STREAMS:
            info = await js.stream_info(spec.name)
            assert str(getattr(info.config.retention, "value", info.config.retention)) == spec.retention
            assert list(info.config.subjects) == list(spec.subjects)
    finally:
        await nc.drain()


async def test_faststream_roundtrip_carries_trace_context(connections):
    """A message published inside a span is consumed, from JetStream, in the same trace."""
    from faststream.nats import JStream, NatsMessage
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from libs.bus.faststream_broker import make_broker
    from libs.contracts import InferenceRequest, subjects

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    broker = make_broker(connections.nats_url, "test", tracer_provider=provider)
    received: asyncio.Future = asyncio.get_running_loop().create_future()
    subject = subjects.infer("itest", "w1", "base")

    @broker.subscriber(
        subject, stream=JStream(name=subjects.INFER_STREAM, declare=False), durable=f"itest-{uuid.uuid4().hex[:8]}"
    )
    async def handle(body: InferenceRequest, msg: NatsMessage) -> None:
        received.set_result((body, dict(msg.headers)))

    async with broker:
        await broker.start()
        request = InferenceRequest(request_id="trace-1", tenant_id="t", base_model="smollm2-135m", prompt="hi")
        with provider.get_tracer("test").start_as_current_span("caller") as caller:
            await broker.publish(request, subject, stream=subjects.INFER_STREAM)
        body, headers = await asyncio.wait_for(received, 10)
    assert body == request
    assert format(caller.get_span_context().trace_id, "032x") in headers["traceparent"]
    trace_ids = {span.context.trace_id for span in exporter.get_finished_spans()}
    assert trace_ids == {caller.get_span_context().trace_id}  # publish and process spans joined the trace


async def test_postgres_accepts_the_dsn_the_stack_wrote(connections):
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(connections.pg_dsn)
    try:
        async with engine.begin() as conn:
            await conn.execute(text("CREATE TABLE IF NOT EXISTS smoke (id serial primary key, note text)"))
            await conn.execute(text("INSERT INTO smoke (note) VALUES ('hello')"))
            version = (await conn.execute(text("SHOW server_version"))).scalar_one()
            count = (await conn.execute(text("SELECT count(*) FROM smoke"))).scalar_one()
    finally:
        await engine.dispose()
    assert int(version.split(".")[0]) >= 13 and count >= 1


def test_s3_store_round_trips_an_object_and_checks_credentials(connections):
    from minio import Minio
    from minio.error import S3Error

    client = Minio(
        connections.s3_endpoint,
        access_key=connections.s3_access_key,
        secret_key=connections.s3_secret_key,
        secure=False,
    )
    assert client.bucket_exists(connections.s3_bucket)
    key = f"smoke/{uuid.uuid4().hex}"
    client.put_object(connections.s3_bucket, key, io.BytesIO(b"adapter-bytes"), 13)
    assert client.get_object(connections.s3_bucket, key).read() == b"adapter-bytes"
    intruder = Minio(connections.s3_endpoint, access_key=connections.s3_access_key, secret_key="wrong", secure=False)
    with pytest.raises(S3Error):
        intruder.list_buckets()
