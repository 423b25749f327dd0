"""`python -m services.registry.migrate`: bring the registry's schema to the newest revision, then exit.

The Helm chart runs this as a Job before every install and upgrade (registries then start with
`LPX_REGISTRY_MIGRATE_ON_START=false`), so several registry replicas never race on a migration.
Waits for PostgreSQL (a database started alongside comes up later) and fails in one line when it
never answers. Exit status: 0 migrated (or already current), 1 unreachable or the migration failed.
"""

from __future__ import annotations

import logging
import sys

from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential

from libs.logs import setup_logging
from services.registry.db import is_unavailable, upgrade_head
from services.registry.settings import RegistrySettings

log = logging.getLogger("services.registry.migrate")


def run(settings: RegistrySettings, wait_s: float) -> int:
    dsn = settings.connections.pg_dsn
    try:
        for attempt in Retrying(
            retry=retry_if_exception(is_unavailable),
            stop=stop_after_delay(wait_s),
            wait=wait_exponential(multiplier=0.5, max=5),
            reraise=True,
        ):
            with attempt:
                upgrade_head(dsn)
    except Exception as exc:
        what = "PostgreSQL unreachable" if is_unavailable(exc) else "migration failed"
        log.error("%s after %.0fs: %s: %s", what, wait_s, type(exc).__name__, exc)
        return 1
    log.info("registry schema at the newest revision")
    return 0


def main() -> None:
    settings = RegistrySettings.load()
    setup_logging("registry-migrate", settings.log_level, settings.log_format)
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)  # one line per built-in plugin
    sys.exit(run(settings, wait_s=settings.migrate_wait_s))


if __name__ == "__main__":
    main()
