"""Shared fixtures. Integration and end-to-end tests run against REAL servers started by the same
launcher as `lpx stack up` (one stack per test session, on free loopback ports, in a temp dir), and
the end-to-end tests against one real vLLM engine per session."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from libs.settings import ConnectionSettings

# Nothing in the tests may reach a model hub (there is none here; peft/transformers would try).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def stack():
    from libs.stack import Stack, StackConfig

    # Under /tmp so that PostgreSQL (which runs as `postgres` when we are root) can reach its data.
    state = Path(tempfile.mkdtemp(prefix="lpx-test-stack-"))
    os.chmod(state, 0o755)
    launched = Stack(StackConfig(dir=state, start_timeout_s=90))
    launched.up()
    yield launched
    violations = service_violations(state)
    launched.down()
    shutil.rmtree(state, ignore_errors=True)
    # A service user refused by the broker is a hole in the permissions table (libs/natsauth/permissions.py):
    # the service would fail in production the same way. Tenants' refusals are the tests' own probes.
    assert not violations, "service users hit NATS permission violations:\n" + "\n".join(violations[:20])


def service_violations(state_dir: Path) -> list[str]:
    found = []
    for log in state_dir.glob("nats*/nats*.log"):
        for line in log.read_text(errors="replace").splitlines():
            expected = ("user:tenant:", "Authorization Violation", ":lpx-probe")  # the tests' own probes
            if "Violation" in line and not any(mark in line for mark in expected):
                found.append(line)
    return found


@pytest.fixture(scope="session")
def connections(stack) -> ConnectionSettings:
    """The stack's settings, its NATS URLs carrying the operator's user: a test's own connections
    (observers, fault injectors) act as the operator. A service built from these settings still connects
    as its own user: nats-py prefers the explicit user and password `nats_auth(role)` gives it."""
    return operator_view(ConnectionSettings.load(stack.env_file), stack.env_file)


@pytest.fixture(scope="session")
def stack_nats_url(stack) -> str:
    """The stack's NATS URL as a tenant is given it: no credentials in it."""
    return ConnectionSettings.load(stack.env_file).nats_url


# The auth callout's signing seed of each test stack, by its first NATS URL: a registry a test starts
# answers the broker's callout with it (in production only the registry's own settings hold it).
CALLOUT_SEEDS: dict[str, str] = {}


def operator_view(conn: ConnectionSettings, env_file: Path) -> ConnectionSettings:
    from services.registry.settings import RegistrySettings

    seed = RegistrySettings.load(env_file).nats_callout_seed
    if seed is not None:
        CALLOUT_SEEDS[conn.nats_servers[0]] = seed.get_secret_value()
    admin = conn.nats_auth("admin")
    if not admin:
        return conn
    creds = f"{admin['user']}:{admin['password']}@"
    urls = ",".join(url.replace("://", "://" + creds, 1) for url in conn.nats_servers)
    return conn.model_copy(update={"nats_url": urls})


def callout_seed(conn: ConnectionSettings) -> str | None:
    """The callout seed of the stack `conn` (an operator view) belongs to."""
    first = conn.nats_servers[0]
    scheme, _, rest = first.partition("://")
    return CALLOUT_SEEDS.get(f"{scheme}://{rest.rpartition('@')[2]}")


@pytest.fixture(scope="session")
def base_model_path() -> Path:
    """The real base model (fetched once into $LPX_HOME, then only verified)."""
    from libs.models.bootstrap import fetch

    return fetch("smollm2-135m").path


@pytest.fixture(scope="session")
async def engine(base_model_path):
    """One real vLLM engine per test session (start-up takes ~40 s on CPU)."""
    from libs.engine import EngineConfig, create_engine

    eng = create_engine(EngineConfig(model_path=base_model_path, max_loras=2, max_cpu_loras=4))
    await eng.start()
    yield eng
    await eng.shutdown()
