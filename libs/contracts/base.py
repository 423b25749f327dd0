"""The envelope every message shares. Every message carries `schema_version`; a consumer refuses
versions it does not know (the message goes to the dead-letter subject with the reason) instead of
guessing.

Adapter identity is the content digest (sha256 of the version's files). Names and aliases never
appear where a cache key or an applied-adapter check is needed.
"""

from __future__ import annotations

import time
import uuid
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION = 1


DIGEST_PATTERN = r"^[0-9a-f]{64}$"


ID_PATTERN = r"^[A-Za-z0-9_-]{1,128}$"


def new_id() -> str:
    return uuid.uuid4().hex


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = SCHEMA_VERSION


class AdapterRef(BaseModel):
    """What a worker needs to fetch, verify and apply one immutable adapter version."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    digest: str = Field(pattern=DIGEST_PATTERN)
    object_key: str
    base_model: str
    rank: int = Field(gt=0)
    size_bytes: int = Field(ge=0, default=0)


class DeadLetter(Message):
    """A message a service could not process, kept with the reason (nothing is dropped silently)."""

    service: str
    original_subject: str
    reason: str
    payload: str  # original bytes, decoded as UTF-8 with replacement (the first 64 KiB characters)
    payload_bytes: int = 0  # size of the original payload
    truncated: bool = False  # the payload kept here is the start of a longer one
    headers: dict[str, str] = Field(default_factory=dict)
    ts: float = Field(default_factory=time.time)
