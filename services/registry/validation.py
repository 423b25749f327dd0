"""Registry-side validation at push. Every check runs BEFORE anything is uploaded or written, so a
refused push leaves no row and no object. Structural rules shared with the eval gate live in
`libs.lora.validate`; this module adds names, sizes and the base-model match."""

from __future__ import annotations

import re
from pathlib import Path

from libs.lora.format import ADAPTER_FILES, AdapterFiles, AdapterFormatError, check_layout, read_adapter
from libs.lora.validate import AdapterInvalid, Policy, validate_adapter
from libs.models.catalog import BaseModelSpec
from services.registry.errors import Invalid, TooLarge

# fullmatch, never match + `$`: in Python's re, `$` also matches before a trailing newline.
NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
# Base names may carry a version with dots (llama-3.1-8b); ".." is still refused.
BASE_NAME = re.compile(r"[a-z0-9][a-z0-9.-]{0,62}")
PINNED_SUFFIX = re.compile(r".*-v[0-9]+")
UPLOAD_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def check_name(kind: str, value: str) -> str:
    """Tenant, adapter, alias, base and dataset names: lowercase letters, digits and '-', 1-63 chars."""
    if not isinstance(value, str) or not NAME.fullmatch(value):
        raise Invalid(
            f"invalid {kind} name {value!r}: use 1-63 lowercase letters, digits and '-', starting "
            f"with a letter or digit (no '/', '.', spaces or control characters)",
            code="bad_name",
        )
    return value


def check_base_name(value: str) -> str:
    if not isinstance(value, str) or not BASE_NAME.fullmatch(value) or ".." in value:
        raise Invalid(
            f"invalid base model name {value!r}: use 1-63 lowercase letters, digits, '-' and '.', "
            f"starting with a letter or digit",
            code="bad_name",
        )
    return value


def check_adapter_name(value: str) -> str:
    check_name("adapter", value)
    if PINNED_SUFFIX.fullmatch(value):
        # `<adapter>-v<N>` is the pinned alias of version N; an adapter of that name would be ambiguous.
        raise Invalid(
            f"invalid adapter name {value!r}: names ending in -v<number> are reserved for pinned version aliases",
            code="bad_name",
        )
    return value


def check_upload_file_name(value: str) -> str:
    """A file name from a multipart upload: a plain base name (no directories, no traversal)."""
    if not UPLOAD_FILE_NAME.fullmatch(value or "") or ".." in value:
        raise Invalid(f"refused upload file name {value!r}: plain file names only", code="bad_file_name")
    return value


def check_size(directory: Path, max_bytes: int) -> int:
    size = sum((directory / name).stat().st_size for name in ADAPTER_FILES if (directory / name).exists())
    if size > max_bytes:
        raise TooLarge(f"adapter is {size} bytes, over the limit of {max_bytes} bytes (max_adapter_bytes)")
    return size


def check_base_match(files: AdapterFiles, spec: BaseModelSpec) -> None:
    """The base named in adapter_config.json, when there is one, must be the base it is pushed for."""
    declared = str(files.config.get("base_model_name_or_path") or "").strip()
    if not declared:
        return
    accepted = {spec.name.lower(), spec.source.split(":", 1)[-1].lower()} - {""}
    candidates = {declared.lower(), Path(declared).name.lower()}
    if not accepted & candidates:
        raise Invalid(
            f"adapter was trained for base {declared!r} but is pushed for base {spec.name!r}", code="base_mismatch"
        )


def validate_upload(directory: Path, spec: BaseModelSpec, policy: Policy, max_bytes: int) -> AdapterFiles:
    """Every push rule; returns the parsed adapter or raises Invalid with the rule that failed."""
    try:
        check_layout(directory)  # pickles refused before any byte of them is read
        check_size(directory, max_bytes)
        files = read_adapter(directory)
    except AdapterFormatError as exc:
        raise Invalid(str(exc), code="bad_layout") from None
    check_base_match(files, spec)
    try:
        validate_adapter(files, spec, policy)
    except AdapterInvalid as exc:
        raise Invalid(exc.message, code=exc.code) from None
    return files
