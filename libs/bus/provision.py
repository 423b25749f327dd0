"""Streams and KV buckets, created or brought to the declared config, idempotently: every service
provisions what it needs at start and again after each reconnect (a broker restarted without its
memory-stored buckets, or a fresh cluster, gets them back)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping

import nats
from nats.js.api import KeyValueConfig, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import BadRequestError, BucketNotFoundError, NotFoundError

from libs.contracts import subjects
from libs.contracts.subjects import StreamSpec
from libs.settings import nats_servers

log = logging.getLogger(__name__)

_RETENTION = {
    "limits": RetentionPolicy.LIMITS,
    "workqueue": RetentionPolicy.WORK_QUEUE,
    "interest": RetentionPolicy.INTEREST,
}


def stream_config(spec: StreamSpec, replicas: int = 1) -> StreamConfig:
    return StreamConfig(
        name=spec.name,
        description=spec.description or None,
        subjects=list(spec.subjects),
        retention=_RETENTION[spec.retention],
        storage=StorageType.FILE,
        max_age=spec.max_age_s or None,
        duplicate_window=spec.duplicate_window_s,
        num_replicas=replicas,
        allow_direct=spec.allow_direct or None,
    )


class ProvisioningConflict(RuntimeError):
    """A stream exists with a setting that cannot be changed in place. Nothing is deleted: the
    message says which setting differs and what to do."""


# Settings JetStream cannot change on a live stream: a difference is a conflict to report, never a
# reason to delete the stream (and the requests, results and events in it).
_FIXED = ("retention", "storage")


def _conflicts(existing: StreamConfig, wanted: StreamConfig) -> list[str]:
    return [
        f"{name}: the stream has {_plain(getattr(existing, name))}, loraplex needs {_plain(getattr(wanted, name))}"
        for name in _FIXED
        if getattr(existing, name) != getattr(wanted, name)
    ]


def _plain(value) -> str:
    return getattr(value, "value", value)


async def ensure_streams_on(js, specs: Iterable[StreamSpec] = subjects.STREAMS, *, replicas: int = 1) -> None:
    """Create missing streams and bring existing ones to the declared config (idempotent). A stream
    that differs in a setting JetStream cannot change in place raises ProvisioningConflict, naming it."""
    for spec in specs:
        wanted = stream_config(spec, replicas)
        try:
            info = await js.stream_info(spec.name)
        except NotFoundError:
            try:
                await js.add_stream(wanted)
                continue
            except BadRequestError:  # created meanwhile by another service: check it like any other
                info = await js.stream_info(spec.name)
        conflicts = _conflicts(info.config, wanted)
        if conflicts:
            raise ProvisioningConflict(
                f"stream {spec.name} exists with an incompatible config ({'; '.join(conflicts)}). Nothing was "
                f"changed or deleted: move its messages elsewhere if needed, then delete it "
                f"(nats stream rm {spec.name}) and start again"
            )
        try:
            await js.update_stream(wanted)
        except BadRequestError as exc:  # e.g. replicas above the cluster size
            raise ProvisioningConflict(
                f"stream {spec.name} could not be updated to the declared config "
                f"(replicas={replicas}): {exc.description or exc}"
            ) from exc


async def ensure_streams(
    nats_url: str,
    specs: Iterable[StreamSpec] = subjects.STREAMS,
    *,
    replicas: int = 1,
    auth: Mapping[str, str] | None = None,
) -> None:
    """`ensure_streams_on` over a short-lived connection of its own (the stack launcher, tools)."""
    nc = await nats.connect(servers=nats_servers(nats_url), connect_timeout=5, max_reconnect_attempts=3, **(auth or {}))
    try:
        await ensure_streams_on(nc.jetstream(), specs, replicas=replicas)
    finally:
        await nc.drain()


async def ensure_buckets(js, configs: Iterable[KeyValueConfig], *, replicas: int = 1) -> None:
    """Create the KV buckets that are missing. One that exists is left as it is (its first creator
    chose e.g. the heartbeat TTL); a memory-stored bucket lost with a broker restart comes back here."""
    for config in configs:
        try:
            await js.key_value(config.bucket)
            continue
        except (BucketNotFoundError, NotFoundError):
            pass
        try:
            await js.create_key_value(dataclasses.replace(config, replicas=replicas))
            log.info("created KV bucket %s", config.bucket)
        except BadRequestError:  # created meanwhile by another service
            await js.key_value(config.bucket)
