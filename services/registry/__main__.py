"""`python -m services.registry` (or `lpx-registry`): the HTTP admin API, the outbox relay, the NATS
resolve responder and the eval-result consumer, in one process."""

from __future__ import annotations


def main() -> None:
    import uvicorn

    from libs.logs import setup_logging
    from libs.telemetry import setup_telemetry
    from services.registry.api import create_app
    from services.registry.settings import RegistrySettings

    settings = RegistrySettings.load()
    setup_logging("registry", settings.log_level, settings.log_format)
    telemetry = setup_telemetry("registry", metrics_port=settings.metrics_port, metrics_host=settings.metrics_host)
    app = create_app(settings, telemetry=telemetry)
    uvicorn.run(app, host=settings.host, port=settings.port, log_config=None, access_log=False)


if __name__ == "__main__":
    main()
