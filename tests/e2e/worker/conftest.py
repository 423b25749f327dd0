"""Fixtures for worker tests: adapters uploaded to the real S3 store, an in-process worker on the
session's real vLLM engine, and helpers to send requests over JetStream and collect results."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field

import nats
import pytest

from libs.contracts import AdapterRef, InferenceRequest, InferenceResult, SamplingParams, TokenDelta, subjects
from libs.lora.format import read_adapter
from libs.objectstore import ObjectStore
from tests.adapters import noise_adapters, tone_adapter

POOL = "e2e-smollm2-r16"
BASE = "smollm2-135m"


@dataclass(frozen=True)
class UploadedAdapter:
    name: str
    path: object
    ref: AdapterRef


def upload(store: ObjectStore, name: str, path) -> UploadedAdapter:
    files = read_adapter(path)
    digest, prefix = store.put_adapter(path, files.file_digests)
    ref = AdapterRef(digest=digest, object_key=prefix, base_model=BASE, rank=files.rank, size_bytes=files.size_bytes)
    return UploadedAdapter(name, path, ref)


@pytest.fixture(scope="session")
def store(connections) -> ObjectStore:
    s = ObjectStore(connections)
    s.ensure_bucket()
    return s


@pytest.fixture(scope="session")
def tones(base_model_path, store) -> dict[str, UploadedAdapter]:
    return {tone: upload(store, tone, tone_adapter(base_model_path, tone)) for tone in ("pirate", "formal")}


@pytest.fixture(scope="session")
def noise(base_model_path, store) -> list[UploadedAdapter]:
    return [upload(store, f"noise-{i}", p) for i, p in enumerate(noise_adapters(base_model_path, 5))]


@dataclass
class Client:
    """Publishes routed work like the gateway does and gathers results and token deltas."""

    nc: object
    js: object
    results: dict[str, list[InferenceResult]] = field(default_factory=dict)
    deltas: dict[str, list[TokenDelta]] = field(default_factory=dict)
    _arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def start(self) -> None:
        await self.nc.subscribe(subjects.RESULTS_ALL, cb=self._on_result)
        await self.nc.subscribe(subjects.TOKENS_ALL, cb=self._on_token)

    async def _on_result(self, msg) -> None:
        result = InferenceResult.model_validate_json(msg.data)
        self.results.setdefault(result.request_id, []).append(result)
        self._arrived.set()

    async def _on_token(self, msg) -> None:
        delta = TokenDelta.model_validate_json(msg.data)
        self.deltas.setdefault(delta.request_id, []).append(delta)

    async def send(
        self,
        worker: str,
        adapter: UploadedAdapter | None,
        question: str,
        max_tokens: int = 24,
        stream: bool = False,
        pool: str = POOL,
        request_id: str | None = None,
        **extra,
    ) -> str:
        rid = request_id or f"t-{uuid.uuid4().hex[:12]}"
        request = InferenceRequest(
            request_id=rid,
            tenant_id=extra.pop("tenant_id", "tenant-e2e"),
            base_model=BASE,
            adapter=adapter.ref if adapter else None,
            messages=[{"role": "user", "content": question}],
            sampling=SamplingParams(max_tokens=max_tokens),
            stream=stream,
            **extra,
        )
        token = adapter.ref.digest if adapter else "base"
        if worker == subjects.ANY_WORKER:
            subject = subjects.infer_any(pool, token)
        else:
            subject = subjects.infer(pool, worker, token)
        await self.js.publish(subject, request.model_dump_json().encode(), headers={"Nats-Msg-Id": rid})
        return rid

    async def wait(self, request_ids, timeout: float = 240.0) -> dict[str, InferenceResult]:
        deadline = asyncio.get_running_loop().time() + timeout
        while not all(rid in self.results for rid in request_ids):
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                missing = [r for r in request_ids if r not in self.results]
                raise AssertionError(f"no result for {len(missing)} of {len(request_ids)} requests: {missing[:5]}")
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), timeout=min(remaining, 1.0))
            except TimeoutError:
                pass
        return {rid: self.results[rid][-1] for rid in request_ids}


@pytest.fixture
async def client(connections):
    nc = await nats.connect(connections.nats_url)
    c = Client(nc, nc.jetstream())
    await c.start()
    yield c
    try:
        await asyncio.wait_for(nc.drain(), 10)
    except Exception:
        await nc.close()


def worker_settings(connections, tmp_path, worker_id: str, **overrides):
    from services.worker.settings import WorkerSettings

    values = dict(
        worker_id=worker_id,
        pool=POOL,
        base_model=BASE,
        max_loras=2,
        max_cpu_loras=4,
        capacity=8,
        disk_cache_dir=tmp_path / f"cache-{worker_id}",
        heartbeat_interval_s=0.5,
        heartbeat_ttl_s=6,  # the gateway tests' staleness (tests/e2e/gateway/conftest.py)
        # These tests address one worker and check what it did; the pool's load bound would pass part of a
        # burst on to the other workers a test started (the bound has its own tests in tests/integration/fleet).
        load_bound=False,
        # Nor place the registry's active versions: the bucket holds whatever another package's registry left.
        placement_active_set=False,
        connections=connections,
    )
    values.update(overrides)
    return WorkerSettings(**values)


@pytest.fixture
async def make_worker(engine, connections, tmp_path):
    """Start in-process workers on the session's engine; drained at the end of the test."""
    from services.worker.app import Worker

    started = []

    async def _make(worker_id: str, **overrides):
        worker = Worker(worker_settings(connections, tmp_path, worker_id, **overrides), engine=engine)
        await worker.start()
        started.append(worker)
        return worker

    yield _make
    for worker in started:
        if not worker._stopping.is_set():
            await worker.drain()
