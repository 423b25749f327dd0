"""`lpx up`: the whole platform as supervised local processes (the machine without Docker).

The stack (NATS JetStream, PostgreSQL, S3) plus every service: the registry, one eval gate per fetched
base model, the trainer, N workers per pool and the gateway, each under supervisord (restarted when it
exits, logs per service), with the state in `$LPX_HOME/up`. See libs/up/platform.py.
"""
