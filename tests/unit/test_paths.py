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
