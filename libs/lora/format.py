"""The on-disk and in-store format of one adapter version.

A version is a PEFT adapter directory with exactly two files: `adapter_config.json` and
`adapter_model.safetensors`. Pickled weights (`adapter_model.bin`, `*.pt`) are refused and never
unpickled. Its identity is a content digest over those files, so equal bytes mean one version and
every cache key (disk, host RAM, engine slot, vLLM LoRA id) derives from it.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from libs.hashing import file_sha256

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
ADAPTER_FILES = (CONFIG_FILE, WEIGHTS_FILE)
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
DIGEST_DOMAIN = b"loraplex-adapter-v1\n"

# PEFT key: base_model.model.model.layers.<i>.<block>.<module>.lora_<A|B>.weight
_LORA_KEY = re.compile(r"(?:^|\.)layers\.(\d+)\.(?:[A-Za-z_]+\.)*?([A-Za-z_]+)\.lora_([AB])(?:\.[A-Za-z_]+)?\.weight$")


class AdapterFormatError(ValueError):
    """The files are not a loadable PEFT LoRA adapter; the message says why."""


def digest_of_files(file_digests: dict[str, str]) -> str:
    """The version digest from each file's sha256 (order-independent, file names included)."""
    h = hashlib.sha256(DIGEST_DOMAIN)
    for name in sorted(file_digests):
        h.update(f"{name}\t{file_digests[name]}\n".encode())
    return h.hexdigest()


def adapter_digest(directory: Path) -> str:
    return digest_of_files({name: file_sha256(directory / name) for name in ADAPTER_FILES})


@dataclass(frozen=True)
class LoraTensor:
    layer: int
    module: str
    kind: str  # "A" (r x in) or "B" (out x r)
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class AdapterFiles:
    directory: Path
    config: dict
    tensors: dict[str, LoraTensor]
    file_digests: dict[str, str]
    size_bytes: int

    @property
    def digest(self) -> str:
        return digest_of_files(self.file_digests)

    @property
    def rank(self) -> int:
        return int(self.config.get("r", 0))

    @property
    def alpha(self) -> float:
        return float(self.config.get("lora_alpha", self.rank))

    @property
    def target_modules(self) -> list[str]:
        targets = self.config.get("target_modules") or []
        return sorted(targets) if isinstance(targets, list) else [str(targets)]

    @property
    def dtypes(self) -> set[str]:
        return {t.dtype for t in self.tensors.values()}


def check_layout(directory: Path) -> None:
    """Refuse anything but the two expected files (pickles in particular) before reading bytes."""
    if not directory.is_dir():
        raise AdapterFormatError(f"{directory} is not a directory")
    names = {p.name for p in directory.iterdir()}
    pickled = sorted(n for n in names if n.endswith(PICKLE_SUFFIXES))
    if pickled:
        raise AdapterFormatError(
            f"pickled weight files are refused (never unpickled): {', '.join(pickled)}; "
            f"save the adapter with safetensors (PEFT's default)"
        )
    missing = [n for n in ADAPTER_FILES if n not in names]
    if missing:
        raise AdapterFormatError(f"not a PEFT adapter directory: missing {', '.join(missing)}")
    extra = sorted(names - set(ADAPTER_FILES) - {"README.md"})
    if extra:
        raise AdapterFormatError(f"unexpected files in the adapter directory: {', '.join(extra)}")


def read_adapter(directory: Path) -> AdapterFiles:
    """Parse config and tensor headers (no tensor data is loaded: safetensors headers only)."""
    from safetensors import safe_open

    directory = Path(directory)
    check_layout(directory)
    try:
        config = json.loads((directory / CONFIG_FILE).read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AdapterFormatError(f"{CONFIG_FILE} is not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise AdapterFormatError(f"{CONFIG_FILE} must hold a JSON object")
    tensors: dict[str, LoraTensor] = {}
    try:
        with safe_open(str(directory / WEIGHTS_FILE), framework="numpy") as handle:  # headers only: no torch needed
            for key in handle.keys():
                tensors[key] = _describe(key, handle.get_slice(key))
    except AdapterFormatError:
        raise
    except Exception as exc:
        raise AdapterFormatError(f"{WEIGHTS_FILE} is not a readable safetensors file: {exc}") from None
    digests = {name: file_sha256(directory / name) for name in ADAPTER_FILES}
    size = sum((directory / name).stat().st_size for name in ADAPTER_FILES)
    return AdapterFiles(directory, config, tensors, digests, size)


def _describe(key: str, tensor_slice) -> LoraTensor:
    match = _LORA_KEY.search(key)
    if not match:
        raise AdapterFormatError(f"tensor {key!r} is not a LoRA A/B weight of a decoder layer")
    layer, module, kind = int(match.group(1)), match.group(2), match.group(3)
    return LoraTensor(layer, module, kind, tuple(tensor_slice.get_shape()), str(tensor_slice.get_dtype()))
