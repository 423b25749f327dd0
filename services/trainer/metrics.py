"""The trainer's OpenTelemetry instruments."""

from __future__ import annotations

from dataclasses import dataclass

from opentelemetry import metrics


@dataclass
class TrainerMetrics:
    jobs: metrics.Counter  # finished, by outcome (pushed / failed)
    running: metrics.UpDownCounter
    duration: metrics.Histogram
    steps: metrics.Counter
    loss: metrics.Histogram

    @classmethod
    def create(cls, meter: metrics.Meter) -> TrainerMetrics:
        return cls(
            jobs=meter.create_counter("lpx_trainer_jobs", description="training jobs finished, by outcome"),
            running=meter.create_up_down_counter("lpx_trainer_running", description="jobs being trained"),
            duration=meter.create_histogram("lpx_trainer_job_seconds", unit="s", description="time per job"),
            steps=meter.create_counter("lpx_trainer_steps", description="optimizer steps taken"),
            loss=meter.create_histogram("lpx_trainer_final_loss", description="training loss at the last step"),
        )


def register_queue_gauge(meter: metrics.Meter, trainer) -> None:
    """Jobs waiting for a trainer (the work queue's backlog as this trainer last read it)."""

    def queued(_options):
        yield metrics.Observation(trainer.queued, {"trainer": trainer.settings.trainer_id})

    meter.create_observable_gauge("lpx_trainer_queued", callbacks=[queued], description="jobs waiting for a trainer")
