"""Where loraplex keeps its local state: models, the local stack, caches.

LPX_HOME overrides everything (the Makefile points it at `<repo>/.lpx`). Without it, a command run inside
a checkout, or any folder below one, that has a `.lpx` uses that one, so `lpx` typed by hand after
`make demo` finds the platform the Makefile started. Elsewhere: the XDG data dir.
"""

from __future__ import annotations

import os
from pathlib import Path


def lpx_home() -> Path:
    explicit = os.environ.get("LPX_HOME")
    if explicit:
        return Path(explicit).expanduser().resolve()
    found = checkout_home(Path.cwd())
    if found is not None:
        return found
    xdg = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return (Path(xdg) / "loraplex").resolve()


def checkout_home(start: Path) -> Path | None:
    """The `.lpx` of the loraplex checkout `start` is in (the folder itself or a parent holding both a
    `.lpx` folder and the Makefile that made it), or None."""
    for folder in (start, *start.parents):
        if (folder / ".lpx").is_dir() and (folder / "Makefile").is_file():
            return (folder / ".lpx").resolve()
    return None


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
