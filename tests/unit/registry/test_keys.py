"""API keys: shown once, stored as a hash, verified in constant time, bound to their tenant."""

from __future__ import annotations

from services.registry import keys


def test_a_new_key_carries_its_tenant_and_only_its_hash_is_kept():
    new = keys.generate("acme")
    assert new.plaintext.startswith(f"lpx_acme_{new.key_id}_")
    assert new.key_hash == keys.hash_secret(new.plaintext.rsplit("_", 1)[1])
    assert new.plaintext not in new.key_hash and len(new.key_hash) == 64


def test_keys_are_random():
    assert len({keys.generate("acme").plaintext for _ in range(50)}) == 50


def test_parse_and_match():
    new = keys.generate("tenant-1")
    parsed = keys.parse(new.plaintext)
    assert (parsed.tenant, parsed.key_id) == ("tenant-1", new.key_id)
    assert keys.matches(parsed, new.key_hash)
    assert not keys.matches(parsed, keys.generate("tenant-1").key_hash)


def test_malformed_keys_do_not_parse():
    good = keys.generate("acme").plaintext
    for bad in (
        "",
        "garbage",
        good + "\n",
        good[:-1],
        good.replace("lpx_", "sk_"),
        good + "0",
        " " + good,
        good.replace("acme", "ACME"),
    ):
        assert keys.parse(bad) is None, bad


def test_a_nats_credential_is_its_own_kind_and_never_an_api_key():
    from libs.client import tenant_of

    nats_cred = keys.generate("acme", keys.NATS)
    assert nats_cred.plaintext.startswith("lpxn_acme_") and nats_cred.kind == keys.NATS
    parsed = keys.parse(nats_cred.plaintext)
    assert parsed.kind == keys.NATS and parsed.tenant == "acme" and keys.matches(parsed, nats_cred.key_hash)
    assert keys.parse(keys.generate("acme").plaintext).kind == keys.INFERENCE
    assert tenant_of(nats_cred.plaintext) == "acme" and tenant_of("lpx_nope") is None
