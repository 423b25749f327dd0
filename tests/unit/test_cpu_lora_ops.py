"""The segment-grouped CPU LoRA ops give what vLLM's own ops give (with the no-LoRA fix), row for row."""

import pytest

torch = pytest.importorskip("torch")
lora_ops = pytest.importorskip("vllm.lora.ops.torch_ops.lora_ops")

from libs.engine import cpu_lora_ops, vllm_patches  # noqa: E402


@pytest.fixture(scope="module")
def vllm_ops():
    """vLLM's gather ops with only the -1 fix: the reference every grouped op is checked against."""
    vllm_patches.apply()
    return {name: vllm_patches._skip_no_lora_rows(vllm_patches.ORIGINALS[name]) for name in vllm_patches._GATHER_OPS}


def _case(seed: int, rank: int, tokens: int, slots: int = 4, width_in: int = 48, width_out: int = 40, stacked=True):
    gen = torch.Generator().manual_seed(seed)
    shape_a, shape_b = (slots, 1, rank, width_in), (slots, 1, width_out, rank)
    if not stacked:
        shape_a, shape_b = shape_a[:1] + shape_a[2:], shape_b[:1] + shape_b[2:]
    lora_a = torch.randn(shape_a, generator=gen)
    lora_b = torch.randn(shape_b, generator=gen)
    x = torch.randn(tokens, width_in, generator=gen)
    indices = torch.randint(-1, slots, (tokens,), generator=gen)
    return lora_a, lora_b, x, indices


CASES = [
    (seed, rank, tokens, stacked)
    for seed, rank, tokens, stacked in [
        (0, 8, 1, True),
        (1, 16, 7, True),
        (2, 8, 64, False),
        (3, 16, 300, True),
        (4, 16, 33, False),
    ]
]


@pytest.mark.parametrize(("seed", "rank", "tokens", "stacked"), CASES)
def test_shrink_matches_vllm(vllm_ops, seed, rank, tokens, stacked):
    lora_a, _, x, indices = _case(seed, rank, tokens, stacked=stacked)
    expected, got = torch.zeros(tokens, rank), torch.zeros(tokens, rank)
    vllm_ops["bgmv_shrink"](x, lora_a, expected, indices, 0.5)
    cpu_lora_ops.grouped_bgmv_shrink(x, lora_a, got, indices, 0.5)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(got[indices < 0], torch.zeros_like(got[indices < 0]))  # base rows untouched


@pytest.mark.parametrize(("seed", "rank", "tokens", "stacked"), CASES)
@pytest.mark.parametrize("add", [True, False])
def test_expand_matches_vllm(vllm_ops, seed, rank, tokens, stacked, add):
    _, lora_b, _, indices = _case(seed, rank, tokens, stacked=stacked)
    shrunk = torch.randn(tokens, rank, generator=torch.Generator().manual_seed(seed + 10))
    base = torch.randn(tokens, 40, generator=torch.Generator().manual_seed(seed + 20))
    expected, got = base.clone(), base.clone()
    vllm_ops["bgmv_expand"](shrunk, lora_b, expected, indices, add)
    cpu_lora_ops.grouped_bgmv_expand(shrunk, lora_b, got, indices, add)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(got[indices < 0], base[indices < 0])


@pytest.mark.parametrize(("seed", "rank", "tokens", "stacked"), CASES)
def test_expand_slice_matches_vllm_and_leaves_other_columns(vllm_ops, seed, rank, tokens, stacked):
    _, lora_b, _, indices = _case(seed, rank, tokens, stacked=stacked)
    shrunk = torch.randn(tokens, rank, generator=torch.Generator().manual_seed(seed + 30))
    base = torch.randn(tokens, 100, generator=torch.Generator().manual_seed(seed + 40))
    expected, got = base.clone(), base.clone()
    vllm_ops["bgmv_expand_slice"](shrunk, lora_b, expected, indices, 30, 40, True)
    cpu_lora_ops.grouped_bgmv_expand_slice(shrunk, lora_b, got, indices, 30, 40, True)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(got[:, :30], base[:, :30]) and torch.equal(got[:, 70:], base[:, 70:])


def test_a_whole_batch_on_one_adapter_and_a_base_only_batch():
    lora_a, _, x, _ = _case(5, 16, 12)
    everyone = torch.full((12,), 2)
    got = torch.zeros(12, 16)
    cpu_lora_ops.grouped_bgmv_shrink(x, lora_a, got, everyone, 1.0)
    torch.testing.assert_close(got, x @ lora_a[2, 0].t())
    untouched = torch.full((12, 16), 7.0)
    cpu_lora_ops.grouped_bgmv_shrink(x, lora_a, untouched, torch.full((12,), -1), 1.0)
    assert torch.equal(untouched, torch.full((12, 16), 7.0))


def test_slot_groups_partition_the_rows_with_an_adapter():
    groups = cpu_lora_ops.slot_groups(torch.tensor([1, -1, 0, 1, 1, -1]))
    assert [(slot, rows.tolist()) for slot, rows in groups] == [(0, [2]), (1, [0, 3, 4])]
    assert cpu_lora_ops.slot_groups(torch.tensor([-1, -1])) == []


def test_sgmv_entry_points_use_the_grouped_ops(vllm_ops):
    """vLLM v1 always calls the sgmv_* ops (per-segment metadata); they must reach the grouped path."""
    lora_a, _, x, _ = _case(6, 8, 10)
    seg_slots, seg_lens = torch.tensor([0, -1, 3]), torch.tensor([4, 3, 3])
    got, expected = torch.zeros(10, 8), torch.zeros(10, 8)
    lora_ops.sgmv_shrink(x, lora_a, got, torch.tensor([0, 4, 7]), seg_lens, seg_slots, 3, 4, 10, 1.0)
    vllm_ops["bgmv_shrink"](x, lora_a, expected, torch.repeat_interleave(seg_slots, seg_lens), 1.0)
    torch.testing.assert_close(got, expected)
    assert lora_ops.bgmv_shrink is cpu_lora_ops.grouped_bgmv_shrink


def test_a_broadcast_output_falls_back_to_vllms_op(vllm_ops):
    _, lora_b, _, _ = _case(7, 8, 1)
    one_row = torch.randn(1, 8)
    out = torch.zeros(3, 40)
    cpu_lora_ops.grouped_bgmv_expand(one_row, lora_b, out, torch.tensor([1]), True)
    expected = torch.zeros(3, 40)
    vllm_ops["bgmv_expand"](one_row, lora_b, expected, torch.tensor([1]), True)
    torch.testing.assert_close(out, expected)


def test_ops_choice_reads_the_environment(monkeypatch):
    monkeypatch.setenv(vllm_patches.OPS_ENV, "vllm")
    assert vllm_patches.ops_choice() == "vllm"
    monkeypatch.setenv(vllm_patches.OPS_ENV, "fast")
    with pytest.raises(ValueError, match="grouped"):
        vllm_patches.ops_choice()


@pytest.mark.parametrize("add", [True, False])
def test_sgmv_expand_ops_match_vllm_over_segments(vllm_ops, add):
    _, lora_b, _, _ = _case(8, 16, 12)
    seg_slots, seg_lens = torch.tensor([2, -1, 2, 0]), torch.tensor([5, 2, 1, 4])
    starts = torch.cumsum(seg_lens, 0) - seg_lens
    exploded = torch.repeat_interleave(seg_slots, seg_lens)
    shrunk = torch.randn(12, 16, generator=torch.Generator().manual_seed(9))
    base = torch.randn(12, 100, generator=torch.Generator().manual_seed(10))
    got, expected = base.clone(), base.clone()
    lora_ops.sgmv_expand_slice(shrunk, lora_b, got, starts, seg_lens, seg_slots, 4, 5, 12, 50, 40, add)
    vllm_ops["bgmv_expand_slice"](shrunk, lora_b, expected, exploded, 50, 40, add)
    torch.testing.assert_close(got, expected)
    got, expected = base[:, :40].clone(), base[:, :40].clone()
    lora_ops.sgmv_expand(shrunk, lora_b, got, starts, seg_lens, seg_slots, 4, 5, 12, add)
    vllm_ops["bgmv_expand"](shrunk, lora_b, expected, exploded, add)
    torch.testing.assert_close(got, expected)


def test_the_group_cache_follows_content_not_tensor_identity():
    """A step reuses the same buffer with new indices: the cache must never return the old grouping."""
    lora_a, _, x, _ = _case(11, 8, 6)
    indices = torch.tensor([0, 0, 1, 1, -1, 2])
    first = torch.zeros(6, 8)
    cpu_lora_ops.grouped_bgmv_shrink(x, lora_a, first, indices, 1.0)
    indices.copy_(torch.tensor([2, -1, 0, 3, 3, 1]))  # same tensor, same storage, new content
    second, expected = torch.zeros(6, 8), torch.zeros(6, 8)
    cpu_lora_ops.grouped_bgmv_shrink(x, lora_a, second, indices, 1.0)
    for row, slot in enumerate(indices.tolist()):
        if slot >= 0:
            expected[row] = x[row] @ lora_a[slot, 0].t()
    torch.testing.assert_close(second, expected)


def test_grouped_ops_replace_the_sgmv_names_vllm_v1_calls(vllm_ops):
    punica_cpu = pytest.importorskip("vllm.lora.punica_wrapper.punica_cpu")
    if vllm_patches.ops_choice() != "grouped":
        pytest.skip("LPX_CPU_LORA_OPS=vllm in this environment")
    for name in ("sgmv_shrink", "sgmv_expand", "sgmv_expand_slice", "bgmv_shrink"):
        assert getattr(punica_cpu, name) is cpu_lora_ops.GROUPED[name]
    assert punica_cpu.PunicaWrapperCPU.add_lora_linear is cpu_lora_ops.grouped_add_lora_linear


def _wrapper_with(indices: torch.Tensor):
    from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU

    wrapper = PunicaWrapperCPU(max_num_batched_tokens=64, max_batches=8, device="cpu")
    wrapper._token_lora_indices[: len(indices)].copy_(indices)
    wrapper.indices_len[0] = len(indices)
    return wrapper


@pytest.mark.parametrize("pattern", ["mixed", "one adapter", "base only"])
@pytest.mark.parametrize("rank", [8, 16])
def test_add_lora_linear_matches_the_per_row_definition(vllm_ops, pattern, rank):
    """A qkv-like layer (3 slices): y[r, slice i] += x[r] @ A_i[slot].T @ B_i[slot].T, base rows untouched."""
    gen = torch.Generator().manual_seed(rank)
    tokens, width, sizes = 11, 48, (40, 16, 16)
    indices = {
        "mixed": torch.tensor([0, -1, 3, 3, 1, 0, -1, 2, 3, 0, 1]),
        "one adapter": torch.full((tokens,), 2),
        "base only": torch.full((tokens,), -1),
    }[pattern]
    lora_a = tuple(torch.randn(4, 1, rank, width, generator=gen) for _ in sizes)
    lora_b = tuple(torch.randn(4, 1, size, rank, generator=gen) for size in sizes)
    x = torch.randn(tokens, width, generator=gen)
    base = torch.randn(tokens, sum(sizes), generator=gen)
    got = base.clone()
    cpu_lora_ops.grouped_add_lora_linear(_wrapper_with(indices), got, x, lora_a, lora_b, 1.0, sizes)
    expected = base.clone()
    for row, slot in enumerate(indices.tolist()):
        offset = 0
        for a, b, size in zip(lora_a, lora_b, sizes, strict=True):
            if slot >= 0:
                expected[row, offset : offset + size] += (x[row] @ a[slot, 0].t()) @ b[slot, 0].t()
            offset += size
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    assert torch.equal(got[indices < 0], base[indices < 0])


def test_add_lora_linear_falls_back_on_shapes_it_does_not_cover(vllm_ops):
    indices = torch.tensor([0, 1, -1])
    lora_a, lora_b = (torch.randn(2, 1, 8, 16),), (torch.randn(2, 1, 12, 8),)
    x, y = torch.randn(3, 16), torch.zeros(3, 12)
    calls = []
    original = cpu_lora_ops._FALLBACK["add_lora_linear"]
    cpu_lora_ops._FALLBACK["add_lora_linear"] = lambda *args, **kwargs: calls.append(args)
    try:
        wrapper = _wrapper_with(indices)
        wrapper.indices_len[0] = 2  # vLLM's indices disagree with the batch: not ours to guess
        cpu_lora_ops.grouped_add_lora_linear(wrapper, y, x, lora_a, lora_b, 1.0, (12,))
    finally:
        cpu_lora_ops._FALLBACK["add_lora_linear"] = original
    assert len(calls) == 1
