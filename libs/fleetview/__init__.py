"""The fleet as `lpx top` and `lpx adapter where` show it, gathered without a terminal.

Where each number comes from:

- workers, pools, slots, tiers, adapters resident and since when: the workers' heartbeats (the
  `lpx_workers` KV bucket, services/worker/heartbeat.py), read the way the gateways' pool view reads them;
- tok/s per worker and req/s per adapter: the difference of two heartbeats of the same worker process
  (counters `generated_tokens` and `adapter_requests`) divided by the time between them, over the last
  `history_s` seconds of beats, so a rate moves once per heartbeat interval;
- tier hit rates: each worker's `tier_hits` since it started (where its requests found their adapter);
- req/s and in flight per tenant: the gateways' limit reports (`lpx.limits.>`, several a second from every
  gateway, services/gateway/limit_sync.py), requests admitted between two samples divided by the time
  between them; with `--metrics URL` also per HTTP status from the gateways' Prometheus counters
  (`lpx_gateway_requests_total`), the difference of two scrapes;
- queue depths: JetStream's stream and durable-consumer info of the platform's streams.

`sources` reads NATS and HTTP, `rates` keeps what two samples need, `snapshot` turns samples into one
`FleetSnapshot` (pure), `collector` ties them together, `render` draws a snapshot with rich.
"""

from libs.fleetview.collector import FleetCollector
from libs.fleetview.snapshot import FleetSnapshot, Placement, placements, unlisted_disk
from libs.fleetview.sources import FleetUnreachable

__all__ = ["FleetCollector", "FleetSnapshot", "FleetUnreachable", "Placement", "placements", "unlisted_disk"]
