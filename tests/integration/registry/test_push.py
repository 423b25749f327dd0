"""Push: a valid PEFT adapter for SmolLM2 is accepted and stored; every bad input is refused with its
own reason and leaves no row and no object; the same push twice (even concurrently) is one version."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import text

from libs.lora.format import adapter_digest
from libs.objectstore import adapter_prefix
from tests.integration.registry import adapters
from tests.integration.registry.conftest import registry_settings, running_registry

pytestmark = pytest.mark.integration


async def table_counts(registry) -> dict[str, int]:
    async with registry.ctx.engine.connect() as conn:
        return {
            table: (await conn.execute(text(f"SELECT count(*) FROM {table}"))).scalar_one()
            for table in ("adapters", "adapter_versions", "aliases", "outbox")
        }


def stored_objects(registry) -> set[str]:
    store = registry.ctx.store
    return {o.object_name for o in store.client.list_objects(store.bucket, prefix="adapters/", recursive=True)}


@pytest.fixture(scope="module")
async def tenant(registry) -> str:
    await registry.create_tenant("acme")
    return "acme"


async def test_valid_adapter_is_accepted_and_stored(registry, tenant, good_adapter, tmp_path):
    reply = await registry.push(tenant, "support", good_adapter)
    assert reply.status_code == 201, reply.text
    version = reply.json()["version"]
    digest = adapter_digest(good_adapter)
    assert version["digest"] == digest
    assert (version["number"], version["alias"], version["status"]) == (1, "support-v1", "pending")
    assert (version["rank"], version["alpha"], version["dtype"], version["base_model"]) == (
        16,
        32.0,
        "float32",
        "smollm2-135m",
    )
    assert version["object_key"] == adapter_prefix(digest)
    # The stored bytes hash back to the digest (download verifies it).
    fetched = registry.ctx.store.get_adapter(digest, version["object_key"], tmp_path / "fetched")
    assert adapter_digest(fetched) == digest
    listed = (await registry.client.get("/v1/adapters", params={"tenant": tenant})).json()
    assert [(a["name"], a["latest_number"], a["aliases"]) for a in listed] == [("support", 1, ["support"])]


async def test_same_push_twice_is_idempotent(registry, tenant, good_adapter):
    first = await registry.push(tenant, "support", good_adapter)
    second = await registry.push(tenant, "support", good_adapter)
    assert first.status_code == 200 and second.status_code == 200  # already there since the test above
    assert first.json()["version"]["number"] == second.json()["version"]["number"] == 1
    assert second.json()["created"] is False


async def test_concurrent_pushes_of_the_same_content_create_one_version(registry, tenant, good_adapter, tmp_path):
    content = adapters.variant(good_adapter, tmp_path / "concurrent", alpha=20)
    replies = await asyncio.gather(*(registry.push(tenant, "racer", content) for _ in range(4)))
    assert sorted(r.status_code for r in replies) == [200, 200, 200, 201], [r.text for r in replies]
    assert {r.json()["version"]["digest"] for r in replies} == {adapter_digest(content)}
    history = (await registry.client.get(f"/v1/tenants/{tenant}/adapters/racer/versions")).json()
    assert [v["number"] for v in history] == [1]


async def test_a_new_content_is_the_next_version(registry, tenant, good_adapter, tmp_path):
    content = adapters.variant(good_adapter, tmp_path / "v2", alpha=24)
    reply = await registry.push(tenant, "support", content)
    assert reply.status_code == 201, reply.text
    assert (reply.json()["version"]["number"], reply.json()["version"]["alias"]) == (2, "support-v2")


def _bad_cases():
    """(case id, how to make it from the good adapter, expected status, expected code, words in the reason)."""
    return [
        ("rank64", None, 422, "rank_too_high", "max_rank=16"),
        ("nan", lambda src, d: adapters.with_value(src, d, float("nan")), 422, "non_finite", "NaN"),
        ("inf", lambda src, d: adapters.with_value(src, d, float("inf")), 422, "non_finite", "Inf"),
        ("wrong_shape", adapters.with_wrong_shape, 422, "shape_mismatch", "does not match"),
        ("pickle", adapters.with_pickle, 422, "bad_layout", "pickled"),
        ("unknown_target", adapters.with_unknown_target, 422, "unsupported_target", "lm_head"),
        ("float64", lambda src, d: adapters.with_dtype(src, d, "float64"), 422, "dtype_not_allowed", "float64"),
        ("missing_weights", lambda src, d: _without_weights(src, d), 422, "bad_layout", "missing"),
        ("config_not_json", lambda src, d: _broken_config(src, d), 422, "bad_layout", "not valid JSON"),
    ]


def _without_weights(src, dest):
    directory = adapters.copy_adapter(src, dest)
    (directory / "adapter_model.safetensors").unlink()
    return directory


def _broken_config(src, dest):
    directory = adapters.copy_adapter(src, dest)
    (directory / "adapter_config.json").write_text("{not json")
    return directory


@pytest.mark.parametrize(("case", "make", "status", "code", "words"), _bad_cases(), ids=[c[0] for c in _bad_cases()])
async def test_bad_adapter_is_refused_and_leaves_nothing(
    registry, tenant, adapter_dirs, tmp_path, case, make, status, code, words
):
    directory = adapter_dirs["rank64"] if make is None else make(adapter_dirs["good"], tmp_path / case)
    before_rows, before_objects = await table_counts(registry), stored_objects(registry)
    reply = await registry.push(tenant, f"bad-{case.replace('_', '-')}", directory)
    assert reply.status_code == status, reply.text
    assert reply.json()["error"] == code
    assert words in reply.json()["detail"]
    assert await table_counts(registry) == before_rows
    assert stored_objects(registry) == before_objects


@pytest.mark.parametrize(
    ("tenant_name", "adapter_name", "words"),
    [
        ("acme", "../x", "invalid adapter name"),
        ("acme", "a\nb", "invalid adapter name"),
        ("acme", "support\n", "invalid adapter name"),
        ("acme", "Upper", "invalid adapter name"),
        ("acme", "x" * 64, "invalid adapter name"),
        ("acme", "support-v3", "reserved for pinned"),
        ("../acme", "support", "invalid tenant name"),
        ("ac\x00me", "support", "invalid tenant name"),
    ],
)
async def test_bad_names_are_refused(registry, tenant, good_adapter, tenant_name, adapter_name, words):
    before_rows, before_objects = await table_counts(registry), stored_objects(registry)
    reply = await registry.push(tenant_name, adapter_name, good_adapter)
    assert reply.status_code == 422, reply.text
    assert reply.json()["error"] == "bad_name" and words in reply.json()["detail"]
    assert await table_counts(registry) == before_rows
    assert stored_objects(registry) == before_objects


async def test_unknown_and_mismatched_bases_are_refused(registry, tenant, good_adapter):
    before_rows, before_objects = await table_counts(registry), stored_objects(registry)
    unknown = await registry.push(tenant, "elsewhere", good_adapter, base="no-such-base")
    assert unknown.status_code == 404 and unknown.json()["error"] == "unknown_base", unknown.text
    mismatched = await registry.push(tenant, "elsewhere", good_adapter, base="llama-3.1-8b")
    assert mismatched.status_code == 422 and mismatched.json()["error"] == "base_mismatch", mismatched.text
    assert "smollm2-135m" in mismatched.json()["detail"]
    assert await table_counts(registry) == before_rows
    assert stored_objects(registry) == before_objects


async def test_unknown_tenant_is_refused(registry, good_adapter):
    reply = await registry.push("nobody", "support", good_adapter)
    assert reply.status_code == 404 and reply.json()["error"] == "unknown_tenant"


async def test_pool_policy_limits_dtype_and_size(connections, registry_dsn, tenant, good_adapter, tmp_path):
    """A pool that takes float32 only refuses bf16; a small size limit refuses the adapter by size."""
    bf16 = adapters.with_dtype(good_adapter, tmp_path / "bf16", "bfloat16")
    settings = registry_settings(connections, registry_dsn, allowed_dtypes=["float32"], max_adapter_bytes=4 << 20)
    async with running_registry(settings) as strict:
        before_rows, before_objects = await table_counts(strict), stored_objects(strict)
        refused_dtype = await strict.push(tenant, "half", bf16)
        assert refused_dtype.status_code in (413, 422), refused_dtype.text
        too_big = await strict.push(tenant, "big", good_adapter)
        assert too_big.status_code == 413 and too_big.json()["error"] == "too_large", too_big.text
        assert "4194304" in too_big.json()["detail"]
        assert await table_counts(strict) == before_rows
        assert stored_objects(strict) == before_objects
    settings = registry_settings(connections, registry_dsn, allowed_dtypes=["float32"])
    async with running_registry(settings) as strict:
        reply = await strict.push(tenant, "half", bf16)
        assert reply.status_code == 422 and reply.json()["error"] == "dtype_not_allowed", reply.text
        assert "bfloat16" in reply.json()["detail"]


async def test_admin_token_is_required(registry, good_adapter):
    anonymous = await registry.client.post("/v1/tenants", json={"name": "sneaky"}, headers={"Authorization": ""})
    assert anonymous.status_code == 401
    wrong = await registry.client.get("/v1/adapters", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and "admin token" in wrong.json()["detail"]
