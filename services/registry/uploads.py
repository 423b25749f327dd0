"""Multipart uploads into a private temporary directory, with the size limit enforced while
copying and file names checked (plain base names only: no traversal, no overwrites)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from fastapi import UploadFile

from libs.lora.format import PICKLE_SUFFIXES
from services.registry.errors import Invalid, TooLarge
from services.registry.validation import check_upload_file_name

CHUNK = 1 << 20


@contextmanager
def spooled_upload(files: Sequence[UploadFile], max_bytes: int) -> Iterator[Path]:
    """The uploaded files as a directory (removed afterwards)."""
    names = [check_upload_file_name(upload.filename or "") for upload in files]
    pickled = sorted(n for n in names if n.endswith(PICKLE_SUFFIXES))
    if pickled:  # refused by name, before a single byte of them is stored
        raise Invalid(
            f"pickled weight files are refused (never unpickled): {', '.join(pickled)}; save the adapter "
            f"with safetensors (PEFT's default)",
            code="bad_layout",
        )
    directory = Path(tempfile.mkdtemp(prefix="lpx-push-"))
    try:
        total = 0
        for upload, name in zip(files, names, strict=True):
            target = directory / name
            if target.exists():
                raise Invalid(f"file {name!r} was uploaded twice", code="bad_layout")
            total = _copy_limited(upload, target, total, max_bytes)
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _copy_limited(upload: UploadFile, target: Path, total: int, max_bytes: int) -> int:
    upload.file.seek(0)
    with open(target, "wb") as out:
        while block := upload.file.read(CHUNK):
            total += len(block)
            if total > max_bytes:
                raise TooLarge(f"upload is over the limit of {max_bytes} bytes (max_adapter_bytes)")
            out.write(block)
    return total
