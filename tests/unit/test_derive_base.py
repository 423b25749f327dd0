"""The derived base: the residual-stream permutation preserves the model's function exactly, while an
adapter made for the source reads the wrong coordinates on it (it does not transfer)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def tiny_llama(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # non-trivial norm weights, so that a wrong permutation of them would show
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
    return model


@pytest.mark.parametrize("tied", [True, False])
def test_permutation_preserves_the_function(tied):
    from libs.models.derive import permute_residual

    model = tiny_llama()
    if not tied:
        model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone() * 1.3)
    ids = torch.randint(0, 64, (2, 9))
    with torch.no_grad():
        before = model(ids).logits
        permute_residual(model, torch.randperm(32, generator=torch.Generator().manual_seed(1)))
        after = model(ids).logits
    assert torch.allclose(before, after, atol=1e-5)


def test_an_adapter_of_the_source_does_not_transfer():
    from peft import LoraConfig, get_peft_model

    from libs.models.derive import permute_residual

    ids = torch.randint(0, 64, (1, 9))
    outputs = []
    for permuted in (False, True):
        model = tiny_llama()
        if permuted:
            permute_residual(model, torch.randperm(32, generator=torch.Generator().manual_seed(1)))
        base = model(ids).logits.detach()
        torch.manual_seed(3)
        lora = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "o_proj", "down_proj"]))
        with torch.no_grad():
            for name, param in lora.named_parameters():
                if "lora_" in name:
                    param.normal_(0, 0.3)
            outputs.append(lora(ids).logits - base)  # what the adapter changes
    assert not torch.allclose(outputs[0], outputs[1], atol=1e-3)
