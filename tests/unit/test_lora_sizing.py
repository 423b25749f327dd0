"""LoRA size math, checked against hand computation from the published shapes."""

from __future__ import annotations

import json

import pytest

from libs.lora import base_model_params, dtype_bytes, lora_params_per_layer, lora_size, resolve_targets
from libs.models.catalog import LLAMA_31_8B, SMOLLM2_135M, BaseModelSpec, ModuleShape

# Llama-3.1-8B: hidden 4,096; KV dim 8 heads x 128 = 1,024; MLP 14,336; 32 layers.
H, KV, MLP, LAYERS = 4096, 8 * 128, 14336, 32


def test_one_module_is_rank_times_in_plus_out():
    assert lora_params_per_layer(ModuleShape(in_features=10, out_features=3), rank=4) == 4 * 13


def test_llama_8b_rank_16_all_modules_by_hand():
    r = 16
    per_layer = (
        r * (H + H)  # q
        + r * (H + KV)  # k
        + r * (H + KV)  # v
        + r * (H + H)  # o
        + r * (H + MLP)  # gate
        + r * (H + MLP)  # up
        + r * (MLP + H)  # down
    )
    size = lora_size(LLAMA_31_8B, r, "all")
    assert size.params_per_layer == per_layer
    assert size.params == per_layer * LAYERS == 41_943_040
    assert size.bytes == size.params * 2 == 83_886_080  # bf16
    assert [m.module for m in size.modules] == [
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    ]


def test_attention_only_rank_8_by_hand():
    r = 8
    per_layer = r * (H + H) + 2 * r * (H + KV) + r * (H + H)
    size = lora_size(LLAMA_31_8B, r, "attention")
    assert size.params == per_layer * LAYERS
    assert size.bytes == per_layer * LAYERS * 2


def test_size_scales_linearly_with_rank():
    assert lora_size(LLAMA_31_8B, 64).bytes == 4 * lora_size(LLAMA_31_8B, 16).bytes


def test_smollm2_q_and_v_in_float32_by_hand():
    # SmolLM2-135M: hidden 576, 9 heads of 64 -> q 576; 3 KV heads -> KV dim 192; 30 layers; float32.
    per_layer = 8 * (576 + 576) + 8 * (576 + 192)
    size = lora_size(SMOLLM2_135M, 8, "q,v")
    assert size.targets == ("q_proj", "v_proj")
    assert size.bytes == per_layer * 30 * 4


def test_dtype_override_changes_bytes_not_params():
    bf16 = lora_size(LLAMA_31_8B, 16)
    fp32 = lora_size(LLAMA_31_8B, 16, dtype="float32")
    assert fp32.params == bf16.params
    assert fp32.bytes == 2 * bf16.bytes


def test_target_aliases_and_short_names():
    assert resolve_targets("attention") == ("q_proj", "k_proj", "v_proj", "o_proj")
    assert resolve_targets(["down", "q_proj", "q"]) == ("q_proj", "down_proj")
    assert resolve_targets("mlp,attn") == resolve_targets("all")


@pytest.mark.parametrize("bad", ["", "lm_head", "q,bogus"])
def test_unknown_targets_are_rejected(bad):
    with pytest.raises(ValueError):
        resolve_targets(bad)


def test_unknown_dtype_and_bad_rank_are_rejected():
    with pytest.raises(ValueError):
        dtype_bytes("int3")
    with pytest.raises(ValueError):
        lora_size(LLAMA_31_8B, 0)
    assert dtype_bytes("torch.bfloat16") == 2


def test_shapes_from_a_hugging_face_config(tmp_path):
    config = {
        "architectures": ["LlamaForCausalLM"],
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "intermediate_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 1000,
        "torch_dtype": "float16",
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    spec = BaseModelSpec.from_hf_config(path)
    kv = 2 * (64 // 4)
    per_layer = 4 * ((64 + 64) + 2 * (64 + kv) + (64 + 64) + 2 * (64 + 256) + (256 + 64))
    assert lora_size(spec, 4).bytes == per_layer * 2 * 2


def test_llama_8b_base_weights_by_hand():
    projections = H * H + 2 * H * KV + H * H + 3 * H * MLP
    norms = 2 * H
    embeddings = 128256 * H
    expected = LAYERS * (projections + norms) + 2 * embeddings + H  # untied LM head, final norm
    assert base_model_params(LLAMA_31_8B) == expected
    assert 8.0e9 < expected < 8.1e9  # the "8B" in the name
    assert base_model_params(LLAMA_31_8B, tied_embeddings=True) == expected - embeddings
