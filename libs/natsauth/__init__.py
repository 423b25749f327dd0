"""NATS authorization: who may publish and subscribe to what on the platform's broker.

Services connect as static users with least-privilege permissions (`permissions.py`, rendered into
the server config by `server_config.py`). Tenants connect with credentials the registry issues; the
server asks the registry about them through NATS auth callout (`jwt.py` builds the signed answer),
so a credential can be issued or revoked without touching the server's config.
"""
