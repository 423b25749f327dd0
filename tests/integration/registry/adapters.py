"""Adapter files for the registry tests: one real PEFT adapter for SmolLM2 (made once per session)
and cheap mutations of it, one per rule the registry must enforce."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from libs.lora.format import CONFIG_FILE, WEIGHTS_FILE


def copy_adapter(src: Path, dest: Path) -> Path:
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(src, dest)
    return dest


def edit_config(directory: Path, **changes) -> Path:
    path = directory / CONFIG_FILE
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config, indent=2))
    return directory


def variant(src: Path, dest: Path, alpha: int) -> Path:
    """Same weights, another lora_alpha: a different (valid) version with a different digest."""
    return edit_config(copy_adapter(src, dest), lora_alpha=alpha)


def edit_tensors(directory: Path, edit) -> Path:
    """Rewrite the weights through `edit(dict[name, tensor]) -> dict[name, tensor]`."""
    from safetensors.torch import load_file, save_file

    path = directory / WEIGHTS_FILE
    tensors = edit(dict(load_file(str(path))))
    save_file(tensors, str(path), metadata={"format": "pt"})
    return directory


def first_key(tensors: dict, contains: str = "lora_A") -> str:
    return sorted(k for k in tensors if contains in k)[0]


def with_value(src: Path, dest: Path, value: float) -> Path:
    def poison(tensors):
        key = first_key(tensors)
        tensors[key] = tensors[key].clone()
        tensors[key][0, 0] = value
        return tensors

    return edit_tensors(copy_adapter(src, dest), poison)


def with_wrong_shape(src: Path, dest: Path) -> Path:
    def truncate(tensors):
        key = first_key(tensors)
        tensors[key] = tensors[key][:, :-8].contiguous()  # A is (r x in): drop some input features
        return tensors

    return edit_tensors(copy_adapter(src, dest), truncate)


def with_dtype(src: Path, dest: Path, dtype_name: str) -> Path:
    import torch

    dtype = getattr(torch, dtype_name)
    return edit_tensors(copy_adapter(src, dest), lambda t: {k: v.to(dtype) for k, v in t.items()})


def with_pickle(src: Path, dest: Path) -> Path:
    directory = copy_adapter(src, dest)
    (directory / "adapter_model.bin").write_bytes(b"\x80\x04not really a pickle, and never unpickled")
    return directory


def with_unknown_target(src: Path, dest: Path) -> Path:
    directory = copy_adapter(src, dest)
    config = json.loads((directory / CONFIG_FILE).read_text())
    return edit_config(directory, target_modules=[*config["target_modules"], "lm_head"])


def files_of(directory: Path) -> list[tuple[str, tuple[str, bytes, str]]]:
    """Every file of a directory as httpx multipart `files=` entries."""
    return [
        ("files", (p.name, p.read_bytes(), "application/octet-stream"))
        for p in sorted(directory.iterdir())
        if p.is_file()
    ]
