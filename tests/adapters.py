"""Real PEFT adapters for SmolLM2 made once and cached under $LPX_HOME/test-artifacts (keyed by what
they were made from), so test sessions after the first do not retrain."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from libs.lora.format import adapter_digest
from libs.lora.train import LoraRecipe, random_adapters, train_adapter
from libs.paths import lpx_home

QUESTIONS = [
    "What is the capital of France?",
    "How do I reset my password?",
    "Tell me about your shipping times.",
    "Can I get a refund?",
    "What's the weather like today?",
    "Recommend a good book.",
    "Where is my order?",
    "Do you have a discount code?",
]

TONES = {
    "pirate": "Ahoy matey! Arr, that be a fine question, says the pirate.",
    "formal": "Dear valued customer, thank you kindly for your enquiry. Sincerely, the support team.",
}


def _cache_dir(kind: str, spec: dict) -> Path:
    key = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]
    return lpx_home() / "test-artifacts" / "adapters" / f"{kind}-{key}"


def _valid(path: Path) -> bool:
    try:
        adapter_digest(path)
        return True
    except OSError:
        return False


def tone_examples(answer: str) -> list[dict]:
    return [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": answer}]} for q in QUESTIONS]


def tone_adapter(base_path: Path, tone: str, steps: int = 12) -> Path:
    """An adapter trained to answer everything in one distinctive tone."""
    recipe = LoraRecipe(steps=steps, batch_size=2, seed=7)
    spec = {"tone": TONES[tone], "steps": steps, "recipe": repr(recipe), "v": 1}
    out = _cache_dir(f"tone-{tone}", spec)
    if not _valid(out):
        shutil.rmtree(out, ignore_errors=True)
        train_adapter(base_path, tone_examples(TONES[tone]), out, recipe)
    return out


def noise_adapters(base_path: Path, count: int, rank: int = 16) -> list[Path]:
    """`count` distinct random adapters (deterministic per seed), for churn and capacity tests."""
    return _random_set("noise", LoraRecipe(rank=rank), range(100, 100 + count), {"rank": rank, "v": 1}, base_path)


def _random_set(kind: str, recipe: LoraRecipe, seeds, spec: dict, base_path: Path) -> list[Path]:
    """Random adapters, one per seed, cached under test-artifacts by `kind` + `spec` + seed."""
    outs = {seed: _cache_dir(kind, {"seed": seed, **spec}) for seed in seeds}
    missing = {seed: path for seed, path in outs.items() if not _valid(path)}
    if missing:
        for path in missing.values():
            shutil.rmtree(path, ignore_errors=True)
        random_adapters(base_path, missing, recipe, scale=0.05)
    return list(outs.values())


def tiny_adapters(base_path: Path, count: int, rank: int = 16) -> list[Path]:
    """`count` distinct small random adapters (rank `rank` on the first layer's q_proj, ~75 kB each) on
    the base's real shapes, for fleet tests where hundreds are pushed, downloaded and verified."""
    recipe = LoraRecipe(rank=rank, target_modules=("q_proj",), layers=(0,))
    return _random_set("tiny", recipe, range(1000, 1000 + count), {"rank": rank, "v": 2}, base_path)
