"""The eval gate's OpenTelemetry instruments (Prometheus / OTLP through libs.telemetry)."""

from __future__ import annotations

from dataclasses import dataclass

from opentelemetry import metrics


@dataclass
class GateMetrics:
    evaluations: metrics.Counter  # finished, by outcome (passed / failed)
    skipped: metrics.Counter  # events not evaluated, by reason (duplicate, decided, other_base, ...)
    running: metrics.UpDownCounter
    duration: metrics.Histogram
    check_failures: metrics.Counter  # by the check that decided a rejection

    @classmethod
    def create(cls, meter: metrics.Meter) -> GateMetrics:
        return cls(
            evaluations=meter.create_counter("lpx_eval_gate_evaluations", description="finished, by outcome"),
            skipped=meter.create_counter("lpx_eval_gate_skipped", description="events not evaluated, by reason"),
            running=meter.create_up_down_counter("lpx_eval_gate_running", description="evaluations in progress"),
            duration=meter.create_histogram(
                "lpx_eval_gate_duration_seconds", unit="s", description="time from claim to verdict"
            ),
            check_failures=meter.create_counter(
                "lpx_eval_gate_check_failures", description="rejections, by the check that failed"
            ),
        )


def register_queue_gauge(meter: metrics.Meter, gate) -> None:
    def queued(_options):
        yield metrics.Observation(gate.queued, {"gate": gate.settings.gate_id})

    meter.create_observable_gauge(
        "lpx_eval_gate_queued", callbacks=[queued], description="events waiting for this gate's consumer"
    )
