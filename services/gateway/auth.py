"""Tenant API keys as the gateway sees them: `Authorization: Bearer lpx_<tenant>_<key id>_<secret>`.

The gateway parses only the format (to name the tenant in requests to the registry); the registry
verifies the secret. The raw key never appears in logs or cache keys: `fingerprint` is what is kept.
"""

from __future__ import annotations

import hashlib
import re

from services.gateway.errors import bad_key

_KEY = re.compile(r"lpx_(?P<tenant>[a-z0-9][a-z0-9-]{0,62})_(?P<key_id>[0-9a-f]{16})_(?P<secret>[0-9a-f]{64})")


def tenant_of(api_key: str) -> str | None:
    """The tenant a well-formed key names (not verified), or None for a malformed key."""
    match = _KEY.fullmatch(api_key or "")
    return match["tenant"] if match else None


def fingerprint(api_key: str) -> str:
    return hashlib.sha256(api_key.encode()).hexdigest()


def bearer_key(authorization: str | None) -> tuple[str, str]:
    """(api key, tenant) from an Authorization header; GatewayError 401 when missing or malformed."""
    if not authorization:
        raise bad_key()
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise bad_key()
    key = token.strip()
    tenant = tenant_of(key)
    if tenant is None:
        raise bad_key()
    return key, tenant
