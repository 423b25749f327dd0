"""Structured logging: human-readable console logs for operators, one JSON object per line for
machines (set LPX_<SERVICE>_LOG_FORMAT=json in containers). Every record carries the service name
and, inside a span, the trace and span ids so logs and traces join up."""

from __future__ import annotations

import json
import logging
import sys
import time

from opentelemetry import trace

_RESERVED = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


class _ContextFilter(logging.Filter):
    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def filter(self, record: logging.LogRecord) -> bool:
        record.service = self.service
        ctx = trace.get_current_span().get_span_context()
        record.trace_id = format(ctx.trace_id, "032x") if ctx.is_valid else ""
        record.span_id = format(ctx.span_id, "016x") if ctx.is_valid else ""
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        # Anything passed through `extra=` becomes a field (request_id, adapter digest, ...).
        doc.update({k: v for k, v in record.__dict__.items() if k not in _RESERVED and not k.startswith("_")})
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


def setup_logging(service: str, level: str = "INFO", fmt: str = "console") -> None:
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    if fmt == "json":
        handler: logging.Handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonFormatter())
    else:
        from rich.logging import RichHandler

        handler = RichHandler(show_path=False, rich_tracebacks=True, log_time_format="%H:%M:%S")
        handler.setFormatter(logging.Formatter("[%(service)s] %(message)s"))
    handler.addFilter(_ContextFilter(service))
    root.addHandler(handler)
    root.setLevel(level.upper())
    # Chatty libraries stay at WARNING unless asked for.
    for noisy in ("nats", "faststream", "httpx", "urllib3", "asyncio"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
