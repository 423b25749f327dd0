"""NATS JWTs (alg `ed25519-nkey`), encoded and decoded by hand.

The auth callout exchange is two JWTs: the server's authorization request (signed by the server's
nkey) and our authorization response (signed by the callout issuer's account nkey) that carries a
user JWT with the connection's permissions. The format is small and fixed (nats-io/jwt v2: a JOSE
header, JSON claims, base64url without padding, `jti` = base32 SHA-512/256 of the claims without
`jti`), so it is written here on top of the `nkeys` signing library rather than pulling in an
unmaintained JWT package.
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
from typing import Any

import nkeys

HEADER = {"typ": "JWT", "alg": "ed25519-nkey"}
CLAIMS_VERSION = 2


class JwtError(ValueError):
    """A token that is not a well-formed or correctly signed NATS JWT."""


def _b64encode(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _b64decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _compact(value: dict) -> str:
    return json.dumps(value, separators=(",", ":"))


def _claims_id(claims: dict) -> str:
    digest = hashlib.new("sha512_256", _compact({k: v for k, v in claims.items() if k != "jti"}).encode())
    return base64.b32encode(digest.digest()).rstrip(b"=").decode()


def encode(claims: dict[str, Any], signer: nkeys.KeyPair) -> str:
    """Sign `claims` with `signer` (its public key becomes `iss`); `iat` and `jti` are filled in."""
    body = {**claims, "iss": signer.public_key.decode(), "iat": int(time.time())}
    body["jti"] = _claims_id(body)
    to_sign = f"{_b64encode(_compact(HEADER).encode())}.{_b64encode(_compact(body).encode())}"
    return f"{to_sign}.{_b64encode(signer.sign(to_sign.encode()))}"


def decode(token: str, *, verify: bool = True) -> dict[str, Any]:
    """The claims of `token`; with `verify`, its signature is checked against its own `iss` key."""
    try:
        header_b64, claims_b64, signature_b64 = token.strip().split(".")
        header = json.loads(_b64decode(header_b64))
        claims = json.loads(_b64decode(claims_b64))
    except (ValueError, json.JSONDecodeError) as exc:
        raise JwtError(f"not a JWT: {exc}") from None
    if header.get("alg") != HEADER["alg"]:
        raise JwtError(f"unsupported JWT algorithm {header.get('alg')!r}")
    if verify:
        try:
            _verify_key(claims["iss"]).verify(f"{header_b64}.{claims_b64}".encode(), _b64decode(signature_b64))
        except Exception as exc:
            raise JwtError(f"bad JWT signature: {type(exc).__name__} {exc}") from None
    return claims


def _verify_key(public: str):
    """nacl's verify key from an nkey public key (base32 of prefix byte, 32 key bytes, CRC16)."""
    import nacl.signing

    raw = base64.b32decode(public + "=" * (-len(public) % 8))
    if len(raw) != 35 or nkeys.crc16_checksum(raw[:-2]) != raw[-2:]:
        raise JwtError(f"{public!r} is not an nkey public key")
    return nacl.signing.VerifyKey(raw[1:33])


def new_account_seed() -> str:
    """A fresh account nkey seed (`SA...`): the callout issuer. Keep it secret."""
    import nacl.signing

    raw = bytes(nacl.signing.SigningKey.generate())
    return nkeys.encode_seed(raw, nkeys.PREFIX_BYTE_ACCOUNT).decode()


def keypair(seed: str) -> nkeys.KeyPair:
    return nkeys.from_seed(seed.encode())


def public_key(seed: str) -> str:
    return keypair(seed).public_key.decode()
