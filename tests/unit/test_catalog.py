import pytest

from libs.engine import lora_int_id
from libs.models import CATALOG, BaseModelSpec, get_spec


def test_llama_reference_shapes():
    spec = get_spec("llama-3.1-8b")
    shapes = spec.module_shapes()
    assert spec.kv_dim == 8 * 128 == 1024
    assert (shapes["q_proj"].in_features, shapes["q_proj"].out_features) == (4096, 4096)
    assert (shapes["k_proj"].in_features, shapes["k_proj"].out_features) == (4096, 1024)
    assert (shapes["down_proj"].in_features, shapes["down_proj"].out_features) == (14336, 4096)


def test_smollm2_shapes_from_its_hf_config():
    config = {
        "architectures": ["LlamaForCausalLM"],
        "num_hidden_layers": 30,
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "vocab_size": 49152,
        "head_dim": 64,
    }
    parsed = BaseModelSpec.from_hf_config(config, name="smollm2-135m")
    assert parsed.module_shapes() == CATALOG["smollm2-135m"].module_shapes()
    assert parsed.kv_dim == 192


def test_unknown_base_names_the_known_ones():
    with pytest.raises(KeyError, match="smollm2-135m"):
        get_spec("gpt-17")


def test_lora_ids_derive_from_digest():
    a, b = "a" * 64, "b" * 64
    assert lora_int_id(a) == lora_int_id(a) >= 1
    assert lora_int_id(a) != lora_int_id(b)
    assert lora_int_id("f" * 64) < 2**63
