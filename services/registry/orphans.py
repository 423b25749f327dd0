"""Sweep adapter objects no version row references (left behind when the database failed between
the upload and the commit, and the push could not prove it was safe to delete them itself).

An object is swept only when it is older than the grace period and, under the digest's advisory
lock (so no push of that content is in flight), still unreferenced.
"""

from __future__ import annotations

import asyncio
import logging
import re
from datetime import UTC, datetime, timedelta

from sqlalchemy import text

from libs.objectstore import adapter_prefix
from services.registry.context import RegistryContext, digest_lock

log = logging.getLogger(__name__)
ADAPTERS_ROOT = "adapters/sha256/"
_DIGEST = re.compile(r"[0-9a-f]{64}")


def _object_ages(ctx: RegistryContext) -> dict[str, datetime]:
    """digest -> newest modification time of its objects."""
    newest: dict[str, datetime] = {}
    for obj in ctx.store.client.list_objects(ctx.store.bucket, prefix=ADAPTERS_ROOT, recursive=True):
        digest = obj.object_name.removeprefix(ADAPTERS_ROOT).split("/", 1)[0]
        if not _DIGEST.fullmatch(digest):
            continue  # not an adapter object of ours
        stamp = obj.last_modified or datetime.now(UTC)
        newest[digest] = max(newest.get(digest, stamp), stamp)
    return newest


async def sweep_orphans(ctx: RegistryContext, grace_s: float | None = None) -> list[str]:
    """Delete unreferenced adapter objects older than the grace period; returns their digests."""
    grace = timedelta(seconds=ctx.settings.orphan_grace_s if grace_s is None else grace_s)
    cutoff = datetime.now(UTC) - grace
    candidates = [d for d, stamp in (await asyncio.to_thread(_object_ages, ctx)).items() if stamp <= cutoff]
    swept = []
    for digest in candidates:
        async with digest_lock(ctx.engine, digest) as conn:
            query = text("SELECT count(*) FROM adapter_versions WHERE digest = :d")
            referenced = (await conn.execute(query, {"d": digest})).scalar_one()
            await conn.commit()
            if not referenced:
                await asyncio.to_thread(ctx.store.delete_prefix, adapter_prefix(digest))
                swept.append(digest)
    if swept:
        log.info("swept %d unreferenced adapter objects", len(swept))
    return swept
