"""Derive a second base model from a fetched one, for base-model migrations without a second download.

The derived base is (1) the source with its residual stream permuted by a seeded permutation, which
leaves the function unchanged (RMSNorm, embeddings and every projection are permuted consistently)
but moves every feature to another coordinate, like an independently trained model would; then (2) a
short full-parameter continued training, so that it is genuinely another checkpoint. Adapters trained
for the source read and write the wrong coordinates on it: they do not transfer, and a migration
must retrain them — which is the point of having it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from libs.models.bootstrap import MANIFEST, WEIGHTS

Progress = Callable[[str, float], None]

# A small, fixed corpus for the continued training: plain support-style text.
CORPUS = [
    "Customer support answers questions about orders, shipping, refunds and accounts.",
    "A good answer is short, polite and tells the customer what happens next.",
    "Orders usually ship within two business days and arrive within a week.",
    "Refunds are issued to the original payment method within five business days.",
]


def permute_residual(model, perm) -> None:
    """Permute the hidden (residual-stream) dimension of a Llama-style causal LM in place."""
    import torch

    inner = model.model
    with torch.no_grad():
        inner.embed_tokens.weight.copy_(inner.embed_tokens.weight[:, perm])
        for layer in inner.layers:
            layer.input_layernorm.weight.copy_(layer.input_layernorm.weight[perm])
            layer.post_attention_layernorm.weight.copy_(layer.post_attention_layernorm.weight[perm])
            for proj in (
                layer.self_attn.q_proj,
                layer.self_attn.k_proj,
                layer.self_attn.v_proj,
                layer.mlp.gate_proj,
                layer.mlp.up_proj,
            ):
                proj.weight.copy_(proj.weight[:, perm])  # they read the residual stream
            for proj in (layer.self_attn.o_proj, layer.mlp.down_proj):
                proj.weight.copy_(proj.weight[perm, :])  # they write it
        inner.norm.weight.copy_(inner.norm.weight[perm])
        if model.lm_head.weight.data_ptr() != inner.embed_tokens.weight.data_ptr():  # untied head
            model.lm_head.weight.copy_(model.lm_head.weight[:, perm])


def _continue_training(model, tok, steps: int, learning_rate: float, progress: Progress) -> list[float]:
    import torch

    batch = tok(CORPUS, return_tensors="pt", padding=True)
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
    model.train()
    losses = []
    for step in range(1, steps + 1):
        loss = model(**batch, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
        progress(f"continued training step {step}/{steps} (loss {losses[-1]:.3f})", 0.2 + 0.6 * step / steps)
    model.eval()
    return losses


def derive_base(
    source: Path,
    dest: Path,
    *,
    seed: int = 0,
    steps: int = 4,
    learning_rate: float = 2e-5,
    progress: Progress = lambda stage, frac: None,
) -> Path:
    """Write the derived checkpoint to `dest` (atomically; an existing verified copy is kept)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    recipe = {"derived_from": source.name, "seed": seed, "steps": steps, "learning_rate": learning_rate, "v": 1}
    if _matches(dest, recipe):
        return dest
    progress("loading the source model", 0.05)
    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(source)
    tok.pad_token = tok.pad_token or tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    generator = torch.Generator().manual_seed(seed)
    permute_residual(model, torch.randperm(model.config.hidden_size, generator=generator))
    losses = _continue_training(model, tok, steps, learning_rate, progress) if steps else []
    progress("saving", 0.85)
    staging = dest.with_name(dest.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging, safe_serialization=True)
    tok.save_pretrained(staging)
    weights = staging / WEIGHTS
    manifest = {
        "name": dest.name,
        "source": f"derived from {source.name}",
        **recipe,
        "losses": losses,
        "weights_sha256": hashlib.sha256(weights.read_bytes()).hexdigest(),
        "weights_bytes": weights.stat().st_size,
        "dtype": "float32",
        "created_at": time.time(),
    }
    (staging / MANIFEST).write_text(json.dumps(manifest, indent=2))
    shutil.rmtree(dest, ignore_errors=True)
    staging.rename(dest)
    progress("done", 1.0)
    return dest


def _matches(dest: Path, recipe: dict) -> bool:
    try:
        manifest = json.loads((dest / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    if any(manifest.get(k) != v for k, v in recipe.items()):
        return False
    return hashlib.sha256((dest / WEIGHTS).read_bytes()).hexdigest() == manifest.get("weights_sha256")
