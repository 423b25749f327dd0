"""Where a stack's PostgreSQL data goes when the server's user cannot reach the state dir.

CI for stop 45 failed on this: a state dir at the same path as an earlier run's (pytest's
`/tmp/pytest-of-root/pytest-0/...`), whose /var/tmp data dir had outlived it, was given that same
data dir. The earlier cluster's password was not the new stack's, so `lpx demo` ended with
"password authentication failed". A fresh stack now always gets a data dir of its own.
"""

import os
from pathlib import Path

import pytest

from libs.stack.postgres_server import postgres_dir
from libs.stack.state import StackConfig, StackState


@pytest.fixture
def blocked_state_dir(tmp_path: Path) -> Path:
    """A state dir under a folder the `postgres` user cannot traverse (mode 700, owned by root)."""
    if os.geteuid() != 0:
        pytest.skip("the /var/tmp placement applies only when running as root")
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    os.chmod(private, 0o700)
    return private / ".lpx" / "stack"


def test_a_fresh_stack_at_a_reused_path_gets_its_own_data_dir(blocked_state_dir: Path):
    config = StackConfig(dir=blocked_state_dir)
    first = Path(StackState.fresh(config).dirs["postgres"])
    second = Path(StackState.fresh(config).dirs["postgres"])
    assert first.is_relative_to("/var/tmp") and second.is_relative_to("/var/tmp")
    assert first != second, "a stack made after the state dir was deleted must not reuse the old cluster"


def test_the_data_dir_is_stable_for_one_stack(blocked_state_dir: Path):
    assert postgres_dir(blocked_state_dir, "abc") == postgres_dir(blocked_state_dir, "abc")
