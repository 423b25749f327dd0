"""Tenant API keys and NATS credentials: random, shown once, stored as a hash.

Format: `lpx_<tenant>_<key id>_<secret>` for an inference key (HTTP and the async client's messages),
`lpxn_<tenant>_<key id>_<secret>` for a NATS credential (the password of the tenant's broker
connection, checked by the registry's auth callout). The two kinds share one table and one id space
(`lpx tenant keys` lists both, `lpx tenant revoke-key` revokes either) but are never interchangeable.
The tenant and key id are not secret: the tenant lets the
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
INFERENCE = "inference"
NATS = "nats"
PREFIXES = {INFERENCE: KEY_PREFIX, NATS: "lpxn"}
_KEY = re.compile(
    r"(?P<prefix>lpxn?)_(?P<tenant>[a-z0-9][a-z0-9-]{0,62})_(?P<key_id>[0-9a-f]{16})_(?P<secret>[0-9a-f]{64})"
)


@dataclass(frozen=True)
class NewKey:
    tenant: str
    key_id: str
    plaintext: str  # shown to the operator once, never stored
    key_hash: str
    kind: str = INFERENCE


@dataclass(frozen=True)
class ParsedKey:
    tenant: str
    key_id: str
    secret: str
    kind: str = INFERENCE


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def generate(tenant: str, kind: str = INFERENCE) -> NewKey:
    key_id, secret = secrets.token_hex(8), secrets.token_hex(32)
    return NewKey(tenant, key_id, f"{PREFIXES[kind]}_{tenant}_{key_id}_{secret}", hash_secret(secret), kind)


def parse(api_key: str) -> ParsedKey | None:
    """The parts of a well-formed key, or None (a malformed key is simply not a key)."""
    match = _KEY.fullmatch(api_key or "")
    if not match:
        return None
    kind = NATS if match["prefix"] == PREFIXES[NATS] else INFERENCE
    return ParsedKey(match["tenant"], match["key_id"], match["secret"], kind)


def matches(parsed: ParsedKey, stored_hash: str) -> bool:
    return hmac.compare_digest(hash_secret(parsed.secret), stored_hash)
