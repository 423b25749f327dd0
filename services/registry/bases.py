"""Base models known to the registry: registered from a model's config.json or seeded from the
catalogue. The stored spec is what every push is validated against."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging

from sqlmodel import select
from sqlmodel.ext.asyncio.session import AsyncSession

from libs.models.catalog import CATALOG, BaseModelSpec
from services.registry.errors import Conflict, NotFound
from services.registry.models import BaseModelRow
from services.registry.validation import check_base_name

log = logging.getLogger(__name__)


def spec_checksum(spec: BaseModelSpec) -> str:
    """sha256 over what validation depends on (architecture, layers, module shapes, vocabulary), so the
    catalogue entry and the same model registered from its config.json agree."""
    shapes = {name: [s.in_features, s.out_features] for name, s in spec.module_shapes().items()}
    doc = {
        "architecture": spec.architecture,
        "num_layers": spec.num_layers,
        "module_shapes": shapes,
        "vocab_size": spec.vocab_size,
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def row_from_spec(spec: BaseModelSpec) -> BaseModelRow:
    shapes = {name: [s.in_features, s.out_features] for name, s in spec.module_shapes().items()}
    return BaseModelRow(
        name=spec.name,
        architecture=spec.architecture,
        num_layers=spec.num_layers,
        module_shapes=shapes,
        checksum=spec_checksum(spec),
        source=spec.source,
        spec=dataclasses.asdict(spec),
    )


def spec_from_row(row: BaseModelRow) -> BaseModelSpec:
    fields = {f.name for f in dataclasses.fields(BaseModelSpec)}
    return BaseModelSpec(**{k: v for k, v in row.spec.items() if k in fields})


async def get_base(session: AsyncSession, name: str) -> BaseModelRow:
    row = (await session.exec(select(BaseModelRow).where(BaseModelRow.name == name))).first()
    if row is None:
        known = ", ".join((await session.exec(select(BaseModelRow.name).order_by(BaseModelRow.name))).all())
        raise NotFound(
            f"unknown base model {name!r}; registered: {known or 'none'} (lpx base register)", code="unknown_base"
        )
    return row


async def list_bases(session: AsyncSession) -> list[BaseModelRow]:
    return list((await session.exec(select(BaseModelRow).order_by(BaseModelRow.name))).all())


async def register_base(session: AsyncSession, spec: BaseModelSpec) -> BaseModelRow:
    """Idempotent for the same shapes and checksum; a different model under a known name is refused."""
    check_base_name(spec.name)
    row = row_from_spec(spec)
    existing = (await session.exec(select(BaseModelRow).where(BaseModelRow.name == spec.name))).first()
    if existing is not None:
        if existing.checksum != row.checksum or existing.module_shapes != row.module_shapes:
            raise Conflict(
                f"base model {spec.name!r} is already registered with a different checksum or shapes "
                f"({existing.checksum[:12]} != {row.checksum[:12]})"
            )
        return existing
    session.add(row)
    await session.flush()
    return row


async def seed_catalog(session: AsyncSession) -> None:
    for spec in CATALOG.values():
        exists = (await session.exec(select(BaseModelRow.id).where(BaseModelRow.name == spec.name))).first()
        if exists is None:
            session.add(row_from_spec(spec))
            log.info("seeded base model %s from the catalogue", spec.name)
