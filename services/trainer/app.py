"""The trainer: takes TrainJobs from the LPX_TRAIN work queue one at a time, trains the LoRA with peft
from the stored dataset (deterministic given the seed), publishes progress (step, loss) and pushes the
result to the registry as a new version of the tenant's adapter (which the eval gate then evaluates).

Exactly once per job: the job is acknowledged after the push and the ledger entry; a trainer killed
mid-training leaves the job unacknowledged, so it is redelivered (after ack_wait) and retrained from
scratch; a redelivered job already in the ledger is not retrained. A trained adapter whose push did
not go through stays in the work dir and is pushed on the retry without training again.

Hand-written over nats-py (not a FastStream subscriber): a job runs for minutes and needs an explicit
keep-alive and acknowledgement after the push.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time

from nats.js.api import KeyValueConfig
from nats.js.errors import KeyNotFoundError
from pydantic import ValidationError

from libs.bus.consumer import PullConsumer, durable_pull, kept_in_progress, one_at_a_time
from libs.bus.dead_letters import DeadLetterPublisher, JetStreamPublisher
from libs.bus.link import BrokerLink
from libs.contracts import TrainJob, TrainProgress, TrainStage, subjects
from libs.contracts.parsing import first_error
from libs.datasets import DatasetInvalid, parse_bytes
from libs.lora.format import adapter_digest
from libs.lora.train import DEFAULT_TARGETS, LoraRecipe, train_adapter
from libs.objectstore import ObjectStore
from libs.telemetry import Telemetry, setup_telemetry
from services.trainer.metrics import TrainerMetrics, register_queue_gauge
from services.trainer.registry_client import RegistryClient, RegistryRefused
from services.trainer.settings import TrainerSettings

log = logging.getLogger(__name__)
SERVICE = "trainer"
QUEUE_POLL_S = 5.0
LEDGER_CONFIG = KeyValueConfig(bucket=subjects.TRAIN_LEDGER_BUCKET, history=1, description="trainer: finished jobs")


class JobFailed(Exception):
    """The job cannot succeed as given (bad dataset, unknown base, refused push): not retried."""


class Trainer:
    def __init__(self, settings: TrainerSettings, *, telemetry: Telemetry | None = None) -> None:
        self.settings = settings
        self.telemetry = telemetry or setup_telemetry(
            SERVICE, metrics_port=settings.metrics_port, metrics_host=settings.metrics_host, set_global=False
        )
        self.metrics = TrainerMetrics.create(self.telemetry.meter())
        self.store = ObjectStore(settings.connections)
        self.registry = RegistryClient(settings.registry_url, settings.admin_secret(), settings.registry_timeout_s)
        self.work_dir = settings.resolved_work_dir()
        self.finished = 0  # jobs this process finished (tests and logs)
        self.queued = 0  # jobs waiting in the work queue, read every QUEUE_POLL_S
        self._stopping = asyncio.Event()
        self._loop_task: asyncio.Task | None = None
        self._queue_task: asyncio.Task | None = None
        register_queue_gauge(self.telemetry.meter(), self)

    # --- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        s = self.settings
        self.link = BrokerLink(s.connections, f"trainer-{s.trainer_id}", buckets=[LEDGER_CONFIG], role="trainer")
        self.nc = await self.link.connect()
        self.js = self.link.js
        self.dead_letters = DeadLetterPublisher(JetStreamPublisher(self.js), SERVICE)
        self.ledger = await self.js.key_value(subjects.TRAIN_LEDGER_BUCKET)
        self.sub = await durable_pull(
            self.link, subjects.TRAIN_STREAM, subjects.TRAIN_JOBS, s.durable, ack_wait=s.ack_wait_s
        )
        room, deliver = one_at_a_time(self.handle, s.retry_delay_s)
        jobs = PullConsumer(self.sub, "train jobs", room=room, deliver=deliver)
        self._loop_task = asyncio.create_task(jobs.run(self._stopping), name="train-pull")
        self._queue_task = asyncio.create_task(self._watch_queue(), name="train-queue")
        log.info("trainer ready", extra={"trainer": s.trainer_id})

    async def run_until(self, stop: asyncio.Event) -> None:
        await stop.wait()
        await self.stop()

    async def stop(self) -> None:
        """Stop pulling; a job in training is abandoned unacknowledged (it is redelivered)."""
        self._stopping.set()
        tasks = [t for t in (self._loop_task, self._queue_task) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        with contextlib.suppress(Exception):
            await self.sub.unsubscribe()
        await self.link.close()
        await self.registry.close()
        self.telemetry.shutdown()

    # --- consuming -------------------------------------------------------------------------------
    async def _watch_queue(self) -> None:
        # Asked of the broker, not counted here: other trainers take jobs from the same queue.
        while True:
            with contextlib.suppress(Exception):
                info = await self.sub.consumer_info()
                self.queued = info.num_pending
            await asyncio.sleep(QUEUE_POLL_S)

    async def handle(self, msg) -> None:
        try:
            job = TrainJob.model_validate_json(msg.data)
        except ValidationError as exc:
            await self.dead_letters.send(msg.subject, f"malformed TrainJob: {first_error(exc)}", msg.data, msg.headers)
            await msg.ack()
            return
        done = await self._recorded(job.job_id)
        if done is not None:
            log.info("job %s already finished (%s); not trained again", job.job_id, done.stage)
            await self._progress(done)
            await msg.ack()
            return
        self.metrics.running.add(1)
        started = time.monotonic()
        try:
            async with kept_in_progress(msg, self.settings.ack_wait_s):
                final = await self._run(job)
        finally:
            self.metrics.running.add(-1)
        self.metrics.jobs.add(1, {"outcome": final.stage.value})
        self.metrics.duration.record(time.monotonic() - started, {"outcome": final.stage.value})
        await self.ledger.put(job.job_id, final.model_dump_json().encode())
        await self._progress(final)
        await msg.ack()
        shutil.rmtree(self.work_dir / job.job_id, ignore_errors=True)
        self.finished += 1

    async def _recorded(self, job_id: str) -> TrainProgress | None:
        try:
            entry = await self.ledger.get(job_id)
        except KeyNotFoundError:
            return None
        return TrainProgress.model_validate_json(entry.value) if entry.value else None

    async def _run(self, job: TrainJob) -> TrainProgress:
        """Train and push; a JobFailed becomes the job's failed outcome (and the migration item's)."""
        try:
            version = await self._train_and_push(job)
        except JobFailed as exc:
            log.warning("job %s (%s/%s) failed: %s", job.job_id, job.tenant, job.adapter, exc)
            if job.migration_id and job.migration_item is not None:
                await self.registry.fail_item(job.migration_id, job.migration_item, str(exc))
            return self._event(job, TrainStage.FAILED, done=True, error=str(exc))
        log.info(
            "job %s: pushed %s/%s v%s (base %s)", job.job_id, job.tenant, job.adapter, version["number"], job.base_model
        )
        return self._event(
            job,
            TrainStage.PUSHED,
            done=True,
            step=job.steps,
            total_steps=job.steps,
            version=version["number"],
            digest=version["digest"],
        )

    async def _train_and_push(self, job: TrainJob) -> dict:
        base_path = self.settings.base_path(job.base_model)
        if not (base_path / "config.json").is_file():
            raise JobFailed(f"base model {job.base_model!r} is not available to this trainer (no {base_path})")
        out_dir = self.work_dir / job.job_id / "adapter"
        if not _complete(out_dir):
            examples = await self._examples(job)
            await self._progress(self._event(job, TrainStage.STARTED, total_steps=job.steps))
            await self._train(job, base_path, examples, out_dir)
        try:
            return await self.registry.push(
                tenant=job.tenant,
                adapter=job.adapter,
                base_model=job.base_model,
                directory=out_dir,
                dataset=job.dataset.name,
                migration_item=job.migration_item,
            )
        except RegistryRefused as exc:
            if exc.status >= 500:
                raise
            raise JobFailed(f"the registry refused the trained adapter: {exc.detail}") from None

    async def _examples(self, job: TrainJob) -> list[dict]:
        dest = self.work_dir / job.job_id / "dataset.jsonl"
        try:
            await asyncio.to_thread(self.store.get_file, job.dataset.object_key, dest, job.dataset.digest)
            return parse_bytes(dest.read_bytes(), require_train=True).train_chats()
        except DatasetInvalid as exc:
            raise JobFailed(f"dataset {job.dataset.name!r} is not trainable: {exc}") from None

    async def _train(self, job: TrainJob, base_path, examples: list[dict], out_dir) -> None:
        loop = asyncio.get_running_loop()
        recipe = LoraRecipe(
            rank=job.rank,
            alpha=job.alpha,
            target_modules=tuple(job.target_modules or DEFAULT_TARGETS),
            steps=job.steps,
            batch_size=job.batch_size,
            learning_rate=job.learning_rate,
            seed=job.seed,
            max_length=self.settings.max_length,
        )

        def on_step(step: int, total: int, loss: float) -> None:  # called in the training thread
            self.metrics.steps.add(1)
            event = self._event(job, TrainStage.TRAINING, step=step, total_steps=total, loss=round(loss, 5))
            asyncio.run_coroutine_threadsafe(self._progress(event), loop)

        staging = out_dir.with_name("adapter.partial")
        shutil.rmtree(staging, ignore_errors=True)
        log.info(
            "training %s/%s on %s (%d examples, %d steps, rank %d)",
            job.tenant,
            job.adapter,
            job.base_model,
            len(examples),
            job.steps,
            job.rank,
        )
        _, losses = await asyncio.to_thread(
            train_adapter, base_path, examples, staging, recipe, on_step, self.settings.device
        )
        self.metrics.loss.record(losses[-1])
        staging.rename(out_dir)

    def _event(self, job: TrainJob, stage: TrainStage, **fields) -> TrainProgress:
        return TrainProgress(
            job_id=job.job_id,
            tenant=job.tenant,
            adapter=job.adapter,
            stage=stage,
            trainer_id=self.settings.trainer_id,
            **fields,
        )

    async def _progress(self, event: TrainProgress) -> None:
        try:
            await self.js.publish(
                subjects.train_progress(event.job_id),
                event.model_dump_json().encode(),
                stream=subjects.TRAIN_PROGRESS_STREAM,
                timeout=5,
            )
        except Exception:
            log.warning("could not publish progress for %s", event.job_id)


def _complete(directory) -> bool:
    try:
        adapter_digest(directory)
        return True
    except OSError:
        return False
