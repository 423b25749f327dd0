"""The gateway's OpenAI-compatible API fuzzed from its own OpenAPI (schemathesis) on the real stack: a
gateway process, a worker process on the simulated engine (fast: the fuzzer's max_tokens of 8,192
answer in a fraction of a second), the registry with a tenant, NATS/PostgreSQL/S3 of the session
stack. No input may give a server error (500), every status and body must be the documented ones."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from libs.fleet import Fleet, FleetSpec
from tests.fuzz import fuzz, seeds
from tests.integration.registry.conftest import create_database, registry_settings, running_registry

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
async def gateway_with_tenant(stack, connections, tmp_path_factory):
    async with running_registry(registry_settings(connections, await create_database(connections))) as registry:
        key = await registry.create_tenant(f"fuzz-{uuid.uuid4().hex[:6]}")
        spec = FleetSpec(pool=f"fuzz-{uuid.uuid4().hex[:6]}", capacity=8, decode_tok_s=200_000, prefill_tok_s=10**7)
        fleet = Fleet(env_file=stack.env_file, state=tmp_path_factory.mktemp("fuzz-gateway"), spec=spec)
        url = fleet.start_gateway("fuzz-gw", {"LPX_GATEWAY_REQUEST_TIMEOUT_S": "20"})
        fleet.start_worker("fuzz-sim-0")
        try:
            await fleet.wait_ready(1)
            yield url, key, fleet
        finally:
            fleet.stop()


async def test_no_input_gives_a_server_error_or_an_undocumented_answer(gateway_with_tenant, tmp_path):
    url, key, fleet = gateway_with_tenant
    runs = []
    for seed in seeds():  # in a thread: the registry answers the gateway from this test's event loop
        run = await asyncio.to_thread(fuzz, f"{url}/openapi.json", {"Authorization": f"Bearer {key}"}, tmp_path,
                                      seed=seed)  # fmt: skip
        (tmp_path / f"fuzz-{run.seed}.txt").write_text(run.output)
        print(f"gateway API fuzz, {run.summary()} (output: {tmp_path}/fuzz-{run.seed}.txt)")
        runs.append(run)
    for run in runs:
        assert run.exit_code == 0, f"{run.summary()}\n{run.output[-6000:]}\ngateway log:\n{fleet.log_tail('fuzz-gw')}"
        assert run.cases > 100, run.summary()  # it really generated requests
