"""Where loraplex keeps its local state: models, the local stack, caches.

LPX_HOME overrides everything (the Makefile points it at `<repo>/.lpx`); otherwise the XDG data dir.
"""

from __future__ import annotations

import os
from pathlib import Path


def lpx_home() -> Path:
    explicit = os.environ.get("LPX_HOME")
    if explicit:
        return Path(explicit).expanduser().resolve()
    xdg = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return (Path(xdg) / "loraplex").resolve()


def models_dir() -> Path:
    return lpx_home() / "models"


def stack_dir() -> Path:
    explicit = os.environ.get("LPX_STACK_DIR")
    return Path(explicit).expanduser().resolve() if explicit else lpx_home() / "stack"


def stack_env_file() -> Path:
    """The env file `lpx stack up` writes and every service and CLI command reads."""
    explicit = os.environ.get("LPX_ENV_FILE")
    return Path(explicit).expanduser().resolve() if explicit else stack_dir() / "stack.env"


def up_dir() -> Path:
    """State of `lpx up`: the supervisor's config and socket, service logs, ports, the admin token."""
    return lpx_home() / "up"


def platform_env_file() -> Path:
    """What `lpx up` writes for the CLI: the registry's URL and admin token, the gateway's URL and metrics."""
    return up_dir() / "platform.env"
