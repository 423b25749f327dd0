"""Everything a KV bucket holds, read once and completely.

Not `KeyValue.watchall()` until its "no more" marker: nats-py sends that marker when a `consumer_info` says
nothing is pending and no message has reached the client yet, and the server answers that request on another
path than the one that delivers the consumer's messages, so the marker can come before them and a full bucket
reads as empty (the likely cause of a CI run in which the registry never deleted a stray value of its active
set, and said nothing). The stream's per-subject counts name every key; one get per key reads it."""

from __future__ import annotations

from nats.js.errors import KeyNotFoundError


async def bucket_contents(js, bucket: str) -> dict[str, bytes]:
    """key -> value of every key of `bucket` whose last message is a value (not a delete or a purge)."""
    prefix = f"$KV.{bucket}."
    info = await js.stream_info(f"KV_{bucket}", subjects_filter=f"{prefix}>")
    kv = await js.key_value(bucket)
    contents: dict[str, bytes] = {}
    for subject in info.state.subjects or {}:
        key = subject.removeprefix(prefix)
        try:
            entry = await kv.get(key)
        except KeyNotFoundError:  # deleted or purged since (KeyDeletedError is one too)
            continue
        contents[key] = entry.value
    return contents
