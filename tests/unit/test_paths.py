"""One state directory, found the same way by everyone: LPX_HOME, else the checkout's `.lpx` from any
folder below it, else the XDG data dir."""

from __future__ import annotations

from libs import paths


def test_a_cli_inside_a_checkout_with_a_state_dir_uses_it(tmp_path, monkeypatch):
    checkout = tmp_path / "loraplex"
    (checkout / ".lpx").mkdir(parents=True)
    (checkout / "Makefile").write_text("demo:\n")
    below = checkout / "libs" / "cli"
    below.mkdir(parents=True)
    monkeypatch.delenv("LPX_HOME", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    for folder in (checkout, below):
        monkeypatch.chdir(folder)
        assert paths.lpx_home() == (checkout / ".lpx").resolve()
    monkeypatch.chdir(tmp_path)  # outside the checkout
    assert paths.lpx_home() == (tmp_path / "xdg" / "loraplex").resolve()
    monkeypatch.setenv("LPX_HOME", str(tmp_path / "explicit"))
    monkeypatch.chdir(below)
    assert paths.lpx_home() == (tmp_path / "explicit").resolve()


def test_a_folder_named_lpx_without_a_checkout_is_not_taken(tmp_path, monkeypatch):
    (tmp_path / ".lpx").mkdir()
    monkeypatch.delenv("LPX_HOME", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.chdir(tmp_path)
    assert paths.lpx_home() == (tmp_path / "xdg" / "loraplex").resolve()


def test_a_stale_platform_env_gets_where_the_cli_looked_and_lpx_up(tmp_path, monkeypatch, capsys):
    """platform.env names a registry that is gone: the CLI says where it looked and suggests `lpx up`
    instead of a bare connection refused."""
    import socket

    import pytest
    import typer

    from libs.cli import registry_cmds

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    home = tmp_path / "home"
    (home / "up").mkdir(parents=True)
    (home / "up" / "platform.env").write_text(f"LPX_REGISTRY_URL=http://127.0.0.1:{port}\n")
    monkeypatch.setenv("LPX_HOME", str(home))
    for name in ("LPX_REGISTRY_URL", "LPX_ENV_FILE", "LPX_STACK_DIR"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(typer.Exit):
        registry_cmds._call("GET", "/v1/tenants")
    said = " ".join(capsys.readouterr().err.split())
    assert f"cannot reach the registry at http://127.0.0.1:{port}" in said
    assert f"state directory {home.resolve()} (platform.env found" in said
    assert "lpx up" in said
