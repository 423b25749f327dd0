"""Training requested through the registry's API (admin, or the tenant's maintainer): the tenant's
stored dataset and the base model are checked, and one TrainJob goes to the trainers' work queue
through the outbox, in the transaction that records `train.requested` in the audit trail (the job is
queued if and only if the request is recorded). The trainer pushes the trained version back with its
own credential, and the eval gate decides as for any other version."""

from __future__ import annotations

from pydantic import BaseModel, Field
from sqlmodel import select
from sqlmodel.ext.asyncio.session import AsyncSession

from libs.contracts import DatasetRef, TrainJob, subjects
from services.registry import aliases, audit, bases
from services.registry.errors import NotFound
from services.registry.models import Dataset
from services.registry.outbox import enqueue_message
from services.registry.validation import check_name


class TrainRequest(BaseModel):
    """The recipe of one training job (the trainer's defaults unless given)."""

    dataset: str = Field(description="the tenant's stored dataset to train on (its train split)")
    adapter: str = Field("support", description="the adapter the trained version is pushed to")
    base_model: str = Field("smollm2-135m", description="a registered base model")
    rank: int = Field(16, ge=1, le=1024)
    alpha: int | None = Field(None, ge=1, le=4096, description="LoRA alpha (default: 2 x rank)")
    steps: int = Field(30, ge=1, le=100_000)
    batch_size: int = Field(4, ge=1, le=1024)
    learning_rate: float = Field(2e-3, gt=0, le=1)
    seed: int = Field(0, ge=0, le=2**31 - 1)


class TrainQueued(BaseModel):
    job_id: str
    tenant: str
    adapter: str
    dataset: str
    base_model: str
    steps: int
    progress_subject: str = Field(description="the NATS subject of the job's progress events")


async def request_training(session: AsyncSession, tenant: str, body: TrainRequest) -> TrainJob:
    row_tenant = await aliases.get_tenant(session, check_name("tenant", tenant))
    check_name("adapter", body.adapter)
    await bases.get_base(session, body.base_model)
    query = select(Dataset).where(Dataset.tenant_id == row_tenant.id, Dataset.name == body.dataset)
    dataset = (await session.exec(query)).first()
    if dataset is None or dataset.train_examples == 0:
        raise NotFound(
            f"tenant {tenant!r} has no dataset {body.dataset!r} with train examples (lpx dataset list {tenant})",
            code="dataset_not_found",
        )
    actor = audit.current_actor()
    job = TrainJob(
        tenant=tenant,
        adapter=body.adapter,
        dataset=DatasetRef(
            name=dataset.name,
            digest=dataset.digest,
            object_key=dataset.object_key,
            train_examples=dataset.train_examples,
            eval_cases=dataset.eval_cases,
        ),
        base_model=body.base_model,
        rank=body.rank,
        alpha=body.alpha or 2 * body.rank,
        steps=body.steps,
        batch_size=body.batch_size,
        learning_rate=body.learning_rate,
        seed=body.seed,
        requested_by=f"{actor.name} ({actor.scope})",
    )
    enqueue_message(session, subjects.TRAIN_JOBS, job, job.job_id)
    after = {"job_id": job.job_id, "dataset": dataset.name, "base_model": body.base_model, "steps": body.steps}
    audit.record(session, "train.requested", body.adapter, tenant=tenant, after=after)
    return job


def queued(job: TrainJob) -> TrainQueued:
    return TrainQueued(
        job_id=job.job_id,
        tenant=job.tenant,
        adapter=job.adapter,
        dataset=job.dataset.name,
        base_model=job.base_model,
        steps=job.steps,
        progress_subject=subjects.train_progress(job.job_id),
    )
