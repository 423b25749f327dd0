"""The gateway's OpenAI-compatible API fuzzed from its own OpenAPI (schemathesis) on the live platform
of this package (gateway and simulated worker processes, the registry with a tenant). No input may
give a server error (500), every status and body must be the documented ones."""

from __future__ import annotations

import asyncio

import pytest

from tests.fuzz import fuzz, seeds
from tests.integration.fuzz.conftest import GATEWAY

pytestmark = pytest.mark.integration


async def test_no_input_gives_a_server_error_or_an_undocumented_answer(platform, tmp_path):
    runs = []
    for seed in seeds():  # in a thread: the registry answers the gateway from this test's event loop
        run = await asyncio.to_thread(fuzz, f"{platform.url}/openapi.json",
                                      {"Authorization": f"Bearer {platform.key}"}, tmp_path, seed=seed)  # fmt: skip
        (tmp_path / f"fuzz-{run.seed}.txt").write_text(run.output)
        print(f"gateway API fuzz, {run.summary()} (output: {tmp_path}/fuzz-{run.seed}.txt)")
        runs.append(run)
    for run in runs:
        log = platform.fleet.log_tail(GATEWAY)
        assert run.exit_code == 0, f"{run.summary()}\n{run.output[-6000:]}\ngateway log:\n{log}"
        assert run.cases > 100, run.summary()  # it really generated requests
