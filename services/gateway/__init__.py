"""The gateway: OpenAI-compatible HTTP and async NATS submission in, tenant auth, cached alias
resolution, bounded-load affinity routing to workers, deadlines, re-routing on worker loss, and the
check that a worker applied exactly the adapter version that was resolved."""
