"""`python -m services.gateway` (or `lpx-gateway`): serve the OpenAI-compatible API and the NATS
submission consumer until SIGTERM/SIGINT."""

from __future__ import annotations

import uvicorn

from libs.logs import setup_logging
from services.gateway.app import create_app
from services.gateway.settings import GatewaySettings


def main() -> None:
    settings = GatewaySettings.load()
    setup_logging("gateway", settings.log_level, settings.log_format)
    app = create_app(settings)
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level.lower(),
        access_log=False,
        timeout_graceful_shutdown=30,
    )


if __name__ == "__main__":
    main()
