"""Registry scopes without a database: who a bearer is, what an admin and a maintainer may touch, and
that every /v1 route is behind one of the two checks (a route acting on a tenant outside its path
checks that tenant itself, and is listed here)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from services.registry import credentials, keys
from services.registry.access_models import ADMIN, MAINTAINER
from services.registry.credentials import Principal
from services.registry.errors import Forbidden, Unauthorized
from services.registry.routes import deps
from services.registry.settings import RegistrySettings

ADMIN_P = Principal("ops", ADMIN)
ACME = Principal("acme-ml", MAINTAINER, tenant="acme")


def ctx(token: str | None = "boot"):
    return SimpleNamespace(settings=RegistrySettings(admin_token=token))


def test_an_admin_acts_on_any_tenant_a_maintainer_on_its_own_only():
    for tenant in ("acme", "globex", None):
        deps.check_tenant(ADMIN_P, tenant)
    deps.check_tenant(ACME, "acme")
    for other in ("globex", "no-such-tenant", None, ""):
        with pytest.raises(Forbidden) as refused:
            deps.check_tenant(ACME, other)
        # the same words whether the other tenant exists or not: nothing is looked up
        assert refused.value.message == "credential 'acme-ml' may act only on tenant 'acme'"


async def test_admin_only_routes_refuse_a_maintainer():
    await deps.require_admin(ADMIN_P)
    with pytest.raises(Forbidden, match="needs the admin scope"):
        await deps.require_admin(ACME)


async def test_the_bootstrap_token_is_an_admin():
    principal = await deps.principal_of(ctx(), "Bearer boot")
    assert principal.is_admin and principal.name == credentials.BOOTSTRAP and principal.token_id is None


async def test_inference_keys_and_nats_credentials_are_refused_by_the_registry():
    for kind in (keys.INFERENCE, keys.NATS):
        with pytest.raises(Unauthorized, match="for the gateway, not the registry"):
            await deps.principal_of(ctx(), f"Bearer {keys.generate('acme', kind).plaintext}")


async def test_no_or_a_wrong_bearer_is_unauthorized():
    for header in (None, "", "Bearer", "Bearer wrong", "Basic Ym9vdA=="):
        with pytest.raises(Unauthorized, match="admin token or registry credential required"):
            await deps.principal_of(ctx(), header)
    with pytest.raises(Unauthorized, match="bootstrap admin token is disabled"):
        await deps.principal_of(ctx(None), "Bearer boot")


def test_tokens_are_recognised_by_their_prefix_only():
    assert credentials.looks_like_token("lpxr_0123456789abcdef_" + "ab" * 32)
    assert not credentials.looks_like_token(keys.generate("acme").plaintext)
    assert keys.parse("lpxr_0123456789abcdef_" + "ab" * 32) is None  # never an API key


# Routes of a tenant router whose tenant is not in the path: each checks it in its handler.
CHECKED_IN_HANDLER = {
    ("POST", "/v1/adapters"),
    ("GET", "/v1/adapters"),
    ("POST", "/v1/datasets"),
    ("POST", "/v1/tokens"),
    ("GET", "/v1/tokens"),
    ("POST", "/v1/tokens/{token_id}/revoke"),
    ("GET", "/v1/audit"),
}
ADMIN_ONLY = {
    ("POST", "/v1/tenants"),
    ("GET", "/v1/tenants"),
    ("PATCH", "/v1/tenants/{tenant}"),
    ("PUT", "/v1/tenants/{tenant}/limits"),
    ("POST", "/v1/base-models"),
    ("GET", "/v1/base-models"),
    ("GET", "/v1/migrations/plan"),
    ("POST", "/v1/migrations"),
    ("GET", "/v1/migrations"),
    ("GET", "/v1/migrations/{migration_id}"),
    ("POST", "/v1/migrations/{migration_id}/items/{item_id}/failed"),
    ("POST", "/v1/admin/sweep-orphans"),
}


def test_every_v1_route_is_behind_the_admin_or_the_tenant_check():
    from services.registry.api import create_app

    app = create_app(RegistrySettings(admin_token="boot"))
    admin_only, tenant_scoped = set(), set()
    for route in app.routes:
        if not getattr(route, "path", "").startswith("/v1/") or route.path.startswith("/v1/resolve/"):
            continue
        checks = {d.call for d in route.dependant.dependencies}
        for method in route.methods:
            if deps.require_admin in checks:
                admin_only.add((method, route.path))
            else:
                assert deps.require_tenant in checks, route.path
                tenant_scoped.add((method, route.path))
                assert "{tenant}" in route.path or (method, route.path) in CHECKED_IN_HANDLER, route.path
    assert admin_only == ADMIN_ONLY
    assert CHECKED_IN_HANDLER <= tenant_scoped
