"""The FastStream broker of the registry's request/reply handlers (core NATS), with tracing."""

from __future__ import annotations

import logging

from libs.settings import nats_servers


def make_broker(nats_url: str, service: str, tracer_provider=None, meter_provider=None, **kwargs):
    """A FastStream NATS broker with OpenTelemetry tracing (trace context rides in headers). `nats_url`
    may list every node of a cluster, comma-separated; pass a BrokerLink's `callbacks()` in kwargs
    to reconnect for ever with one log line per state change."""
    from faststream.nats import NatsBroker
    from faststream.nats.opentelemetry import NatsTelemetryMiddleware

    middleware = NatsTelemetryMiddleware(tracer_provider=tracer_provider, meter_provider=meter_provider)
    # FastStream logs "Received"/"Processed" for every message at this level: DEBUG, or the registry's
    # log would carry two lines per answered request (every request is resolved here first).
    kwargs.setdefault("log_level", logging.DEBUG)
    if "user" in kwargs:  # the service's NATS user (BrokerLink.callbacks): FastStream takes it as security
        from faststream.security import SASLPlaintext

        kwargs["security"] = SASLPlaintext(username=kwargs.pop("user"), password=kwargs.pop("password"))
        # FastStream refuses credentials in a URL beside `security` (a test's operator URL carries some).
        return NatsBroker(
            [_without_credentials(url) for url in nats_servers(nats_url)],
            middlewares=(middleware,),
            name=f"lpx-{service}",
            **kwargs,
        )
    return NatsBroker(nats_servers(nats_url), middlewares=(middleware,), name=f"lpx-{service}", **kwargs)


def _without_credentials(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    return f"{scheme}{sep}{rest.rpartition('@')[2]}" if sep else url
