"""The registry service: tenants, base models, versioned adapters (Postgres + S3), aliases, the
lifecycle state machine and its events (transactional outbox -> JetStream)."""
