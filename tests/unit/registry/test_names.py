"""Names are strict: no traversal, no control characters, no trailing newline (fullmatch, not `$`)."""

from __future__ import annotations

import pytest

from services.registry.errors import Invalid
from services.registry.validation import check_adapter_name, check_base_name, check_name, check_upload_file_name


@pytest.mark.parametrize("name", ["acme", "a", "tenant-123", "0x", "a" * 63])
def test_good_names(name):
    assert check_name("tenant", name) == name


@pytest.mark.parametrize(
    "name", ["", "../x", "a/b", "a\nb", "acme\n", "Acme", "-acme", "a b", "a.b", "a" * 64, "a\x00", "ä", "a_b", None]
)
def test_bad_names(name):
    with pytest.raises(Invalid, match="invalid tenant name") as caught:
        check_name("tenant", name)
    assert caught.value.code == "bad_name"


@pytest.mark.parametrize("name", ["support-v1", "x-v0", "a-v123"])
def test_adapter_names_cannot_look_like_pinned_aliases(name):
    with pytest.raises(Invalid, match="reserved for pinned"):
        check_adapter_name(name)


@pytest.mark.parametrize("name", ["support-v", "v2", "support-v2x", "support-vv2"])
def test_adapter_names_that_only_resemble_pins_are_fine(name):
    assert check_adapter_name(name) == name


def test_base_names_may_carry_dots_but_not_traversal():
    assert check_base_name("llama-3.1-8b") == "llama-3.1-8b"
    for bad in ("..", "a..b", ".hidden", "llama/3", "llama\n"):
        with pytest.raises(Invalid):
            check_base_name(bad)


@pytest.mark.parametrize("name", ["adapter_config.json", "adapter_model.safetensors", "README.md"])
def test_upload_file_names(name):
    assert check_upload_file_name(name) == name


@pytest.mark.parametrize("name", ["../adapter_config.json", "a/b.json", "/etc/passwd", "..", ".hidden", "", "a\n"])
def test_upload_file_names_refused(name):
    with pytest.raises(Invalid):
        check_upload_file_name(name)
