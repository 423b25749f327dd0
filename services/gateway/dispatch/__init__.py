"""Routed work out, results and tokens back: one module per job, in the manner of vLLM's `vllm/lora/`.

* `routing`     which worker of a pool takes a request (bounded-load adapter affinity, baselines)
* `admission`   overload refusal and the per-tenant fair queue of a full pool
* `ledger`      load accounting: in flight per worker, adapter and tenant
* `publishing`  the request onto JetStream, retried while the broker is away
* `delivery`    results back (first wins, digest check, catch-up from the stream)
* `reassembly`  a streamed request's deltas, then its checked final result
* `dispatcher`  the facade that wires them together (`Dispatcher`)
"""

from services.gateway.dispatch.delivery import DigestMismatch, check_applied, check_result
from services.gateway.dispatch.dispatcher import Dispatcher
from services.gateway.dispatch.job import BASE_TOKEN, Job
from services.gateway.dispatch.settings import AdmissionSettings, DeliverySettings, DispatchSettings, RoutingSettings

__all__ = [
    "BASE_TOKEN",
    "AdmissionSettings",
    "DeliverySettings",
    "DigestMismatch",
    "DispatchSettings",
    "Dispatcher",
    "Job",
    "RoutingSettings",
    "check_applied",
    "check_result",
]
