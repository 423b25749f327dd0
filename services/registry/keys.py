"""Tenant API keys: random, shown once, stored as a hash.

Format: `lpx_<tenant>_<key id>_<secret>`. The tenant and key id are not secret: the tenant lets the
gateway name the tenant in a ResolveRequest before anything is verified, the key id finds the row.
The secret is 256 random bits, so a plain sha256 is enough (nothing to brute-force; a slow hash
would only slow down every request); comparison is constant-time.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

KEY_PREFIX = "lpx"
_KEY = re.compile(r"lpx_(?P<tenant>[a-z0-9][a-z0-9-]{0,62})_(?P<key_id>[0-9a-f]{16})_(?P<secret>[0-9a-f]{64})")


@dataclass(frozen=True)
class NewKey:
    tenant: str
    key_id: str
    plaintext: str  # shown to the operator once, never stored
    key_hash: str


@dataclass(frozen=True)
class ParsedKey:
    tenant: str
    key_id: str
    secret: str


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def generate(tenant: str) -> NewKey:
    key_id, secret = secrets.token_hex(8), secrets.token_hex(32)
    return NewKey(tenant, key_id, f"{KEY_PREFIX}_{tenant}_{key_id}_{secret}", hash_secret(secret))


def parse(api_key: str) -> ParsedKey | None:
    """The parts of a well-formed key, or None (a malformed key is simply not a key)."""
    match = _KEY.fullmatch(api_key or "")
    if not match:
        return None
    return ParsedKey(match["tenant"], match["key_id"], match["secret"])


def matches(parsed: ParsedKey, stored_hash: str) -> bool:
    return hmac.compare_digest(hash_secret(parsed.secret), stored_hash)
