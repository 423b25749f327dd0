"""The messaging layer every service uses: one way to connect, provision, consume, keep alive, retry,
dead-letter and de-duplicate over NATS JetStream.

- `link`: `BrokerLink`, a connection that survives broker restarts, outages and leader elections,
  re-provisions after each reconnect and runs the service's hooks; refuses an open broker.
- `provision`: streams and KV buckets, created or brought to the declared config, idempotently.
- `consumer`: the one pull loop (`PullConsumer`), durable pull subscriptions, `kept_in_progress`.
- `retry`: what counts as transient, `publish_retrying` (one Nats-Msg-Id across tries), `last_message`.
- `dead_letters`: the dead-letter record and publisher (reason kept, payload bounded).
- `recent_ids`: the bounded set of recently answered request ids (gateway and worker).
- `state`: one log line per change of a connection's state.
- `faststream_broker`: the FastStream broker the registry serves its request/reply subjects with.

Why one in-house pull loop rather than FastStream subscribers for the JetStream work queues:
`benchmarks/bench_consumer.py` runs both on the gateway's submission path (one nats-server, a work
queue, handlers that wait like a submission waits on its worker), 3 alternations; run
"bench_consumer, 2026-12-03 19:52 UTC, 0f4c450" in benchmarks/RESULTS.md:

| | trickle: publish→handler p50 | burst of 400: p50 | burst throughput |
|---|---|---|---|
| `PullConsumer` | 0.9 ms | 382 ms | 290/s |
| FastStream `PullSub(64)` | 1.8 ms (1.91x) | 7,664 ms (20x) | 30/s (0.10x) |
| FastStream `PullSub(64)`, `max_workers=64` | 2.2 ms (2.32x) | 360 ms (0.94x: a tie) | 289/s (1.00x: a tie) |

FastStream's default pull loop runs each fetched batch to its end before fetching again, so one long
generation holds 63 finished places; its concurrent subscriber ties on bursts. What decides is what a
fixed `max_workers` cannot say: how much to pull is the service's own answer. The worker pulls what
its engine admission and batch share can start (and hands the rest back on drain); the gateway's
submissions leave their place while they wait for a tenant's limit. So the work queues (gateway
submissions, worker requests, trainer jobs, eval-gate events, the registry's verdicts and usage) all
run `PullConsumer`, written once here, and the registry keeps FastStream for what it is good at:
typed request/reply handlers on core NATS (resolve, auth, eval context).
"""
