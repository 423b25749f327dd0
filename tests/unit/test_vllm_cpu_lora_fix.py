"""The plugin that stops vLLM's CPU LoRA ops from applying the last adapter to base-model rows."""

import pytest

torch = pytest.importorskip("torch")
lora_ops = pytest.importorskip("vllm.lora.ops.torch_ops.lora_ops")


def _original(name: str):
    """vLLM's op as shipped (before the plugin replaced it, if it has)."""
    from libs.engine import vllm_patches

    vllm_patches.apply()
    return vllm_patches.ORIGINALS[name]


def _inputs():
    torch.manual_seed(0)
    slots, rank, width, tokens = 3, 4, 6, 5
    lora_a = torch.randn(slots, rank, width)  # shrink weights: (slots, r, in)
    lora_b = torch.randn(slots, width, rank)  # expand weights: (slots, out, r)
    x = torch.randn(tokens, width)
    indices = torch.tensor([0, -1, 2, -1, 1])
    return lora_a, lora_b, x, indices


def test_unpatched_ops_leak_the_last_adapter_into_base_rows():
    from libs.engine.vllm_patches import _skip_no_lora_rows

    lora_a, _, x, indices = _inputs()
    raw = _original("bgmv_shrink")
    out = torch.zeros(len(x), 4)
    raw(x, lora_a, out, indices, 1.0)
    assert out[1].abs().sum() > 0  # the bug: row 1 (no LoRA) got slot 2's delta
    fixed = torch.zeros(len(x), 4)
    _skip_no_lora_rows(raw)(x, lora_a, fixed, indices, 1.0)
    assert torch.equal(fixed[1], torch.zeros(4)) and torch.equal(fixed[3], torch.zeros(4))
    assert torch.allclose(fixed[[0, 2, 4]], out[[0, 2, 4]])  # valid rows unchanged


def test_expand_leaves_base_rows_exactly_as_they_were():
    from libs.engine.vllm_patches import _skip_no_lora_rows

    _, lora_b, _, indices = _inputs()
    shrunk = torch.randn(5, 4)
    base = torch.randn(5, 6)
    out = base.clone()
    raw = _original("bgmv_expand")
    _skip_no_lora_rows(raw)(shrunk, lora_b, out, indices, True)
    assert torch.equal(out[1], base[1]) and torch.equal(out[3], base[3])
    expected = base[0] + lora_b[0] @ shrunk[0]
    assert torch.allclose(out[0], expected, atol=1e-5)


def test_apply_patches_every_name_the_cpu_wrapper_uses():
    from libs.engine import vllm_patches

    vllm_patches.apply()
    punica_cpu = pytest.importorskip("vllm.lora.punica_wrapper.punica_cpu")
    for name in ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice"):
        assert getattr(getattr(lora_ops, name), "_loraplex_skips_no_lora_rows", False)
        assert getattr(punica_cpu, name) is getattr(lora_ops, name)
    assert vllm_patches.apply() is False  # idempotent
