"""What a Dispatcher is told, grouped by the part that uses it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from libs.routing import DEFAULT_BALANCE_FACTOR, DEFAULT_HOT_THRESHOLD, DEFAULT_MAX_SPREAD

if TYPE_CHECKING:
    from services.gateway.settings import GatewaySettings


@dataclass(frozen=True)
class RoutingSettings:
    # "bounded_load" (loraplex's router) everywhere; the others are baselines for the fleet benchmark.
    policy: str = "bounded_load"
    balance_factor: float = DEFAULT_BALANCE_FACTOR
    hot_threshold: int = DEFAULT_HOT_THRESHOLD
    max_spread: int = DEFAULT_MAX_SPREAD
    load_signal: str = "fleet"  # "fleet": heartbeats + own deltas; "local": this gateway's own counts


@dataclass(frozen=True)
class AdmissionSettings:
    # Once a pool is full, requests wait per tenant and go on by fair share (None: FIFO into the pool).
    fair_headroom: float | None = 1.25
    batch_reserve: float = 0.0
    # Interactive requests the pool cannot finish before their deadline are refused at once with this
    # margin (None: never).
    overload_margin: float | None = None


@dataclass(frozen=True)
class DeliverySettings:
    # Results and tokens come to this gateway's own subjects (None: the shared ones, every result).
    gateway_id: str | None = None
    publish_retry_s: float = 30.0  # publish retried (same Nats-Msg-Id) while the broker is away
    catch_up_every_s: float = 5.0  # results stored while a live delivery was missed are looked up this often


@dataclass(frozen=True)
class DispatchSettings:
    routing: RoutingSettings = field(default_factory=RoutingSettings)
    admission: AdmissionSettings = field(default_factory=AdmissionSettings)
    delivery: DeliverySettings = field(default_factory=DeliverySettings)

    @classmethod
    def of_gateway(cls, s: GatewaySettings) -> DispatchSettings:
        return cls(
            routing=RoutingSettings(
                policy=s.routing_policy,
                balance_factor=s.balance_factor,
                hot_threshold=s.hot_threshold,
                max_spread=s.max_spread,
                load_signal=s.load_signal,
            ),
            admission=AdmissionSettings(
                fair_headroom=s.fair_headroom if s.fair_queuing else None,
                batch_reserve=s.batch_reserve,
                overload_margin=s.overload_margin if s.early_refusal else None,
            ),
            delivery=DeliverySettings(gateway_id=s.gateway_id, publish_retry_s=s.publish_retry_s),
        )
