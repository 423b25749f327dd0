"""Reading messages that may be malformed: the reason for a dead letter, and the request id of a
message that failed validation (so the waiting caller can still be answered with that reason)."""

from __future__ import annotations

import json

from pydantic import ValidationError

from libs.contracts import subjects


def first_error(exc: ValidationError) -> str:
    """`field.path: what is wrong` for the first validation error (what a dead letter records)."""
    errors = exc.errors()
    if not errors:
        return str(exc)
    first = errors[0]
    where = ".".join(str(p) for p in first.get("loc", ())) or "message"
    return f"{where}: {first.get('msg')}"


def request_id_of(data: bytes, max_len: int = 128) -> str | None:
    """The request id of a raw message if it has a usable one, else None."""
    try:
        rid = json.loads(data).get("request_id")
        subjects.token(rid)
        return rid if len(rid) <= max_len else None
    except Exception:
        return None


def reply_to_of(data: bytes) -> str | None:
    """The `reply_to` gateway of a raw inference request if it has a usable one, else None."""
    try:
        gateway = json.loads(data).get("reply_to")
        return subjects.token(gateway) if gateway and len(gateway) <= 64 else None
    except Exception:
        return None
