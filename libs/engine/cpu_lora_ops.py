"""Segment-grouped (SGMV-style) multi-LoRA ops for vLLM's CPU build.

vLLM's pure-PyTorch LoRA ops (`vllm/lora/ops/torch_ops/lora_ops.py`, used on CPU) gather one weight
matrix per token: `weights[indices]` materialises a (tokens, out, rank) tensor for every projection of
every layer, and a 512-token prefill against the MLP expand copies ~50 MB per call. Here the rows are
grouped by adapter slot instead, and each group is one dense matmul against that slot's weights, so the
cost is the useful FLOPs plus one index pass, whatever the number of tokens.

Semantics are those of vLLM's Triton kernels (GPU): rows whose index is -1 (base model, no LoRA) are left
exactly as they were. That also fixes vLLM's CPU ops applying the LAST slot to those rows (the bug
`vllm_patches` exists for). Calls whose shapes the grouped path does not cover (an output with a different
row count than the indices, which vLLM broadcasts) go to vLLM's own op, with the same -1 fix.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import torch

Groups = list[tuple[int, torch.Tensor | None]]


def slot_groups(indices: torch.Tensor) -> Groups:
    """(slot, rows) per adapter slot used by `indices`; rows is None when every row uses that slot.

    Rows with a negative index (no LoRA) are in no group. One stable sort, then contiguous runs: no
    per-slot comparison pass over the whole batch.
    """
    if indices.shape[0] == 0:
        return []
    first = int(indices[0])
    if bool((indices == first).all()):
        return [(first, None)] if first >= 0 else []
    ordered, rows = torch.sort(indices, stable=True)
    slots, counts = torch.unique_consecutive(ordered, return_counts=True)
    groups, start = [], 0
    for slot, count in zip(slots.tolist(), counts.tolist(), strict=True):
        if slot >= 0:
            groups.append((slot, rows[start : start + count]))
        start += count
    return groups


def _slot_weight(weights: torch.Tensor, slot: int, dtype: torch.dtype) -> torch.Tensor:
    """The (out, in) matrix of one slot; vLLM stacks weights as (slots, 1, out, in) or (slots, out, in)."""
    weight = weights[slot, 0] if weights.dim() == 4 else weights[slot]
    return weight if weight.dtype == dtype else weight.to(dtype=dtype)


def _group_product(inputs: torch.Tensor, weights: torch.Tensor, slot: int, rows, dtype) -> torch.Tensor:
    x = inputs if rows is None else inputs.index_select(0, rows)
    return x.to(dtype=dtype) @ _slot_weight(weights, slot, dtype).t()


def _write(target: torch.Tensor, rows, values: torch.Tensor, add: bool) -> None:
    """target[rows] (+)= values, in place; target may be a column slice of the output."""
    if rows is None:
        if add:
            target += values
        else:
            target.copy_(values)
    elif add:
        target.index_add_(0, rows, values)
    else:
        target.index_copy_(0, rows, values)


def _covers(output: torch.Tensor, rows: int) -> bool:
    return output.shape[0] == rows


class _GroupCache:
    """The groups of the last few index patterns, keyed by their exact content.

    One forward step calls the ops ~14 times per layer with the same indices; grouping once per step
    instead of once per call removes most of the per-call overhead. Keyed by content (not by tensor
    identity, which the allocator reuses), so a hit is always the right grouping.
    """

    def __init__(self, size: int = 8) -> None:
        self._entries: OrderedDict[tuple, Groups] = OrderedDict()
        self._size = size

    def get(self, key: tuple, compute: Callable[[], Groups]) -> Groups:
        groups = self._entries.get(key)
        if groups is None:
            groups = self._entries[key] = compute()
            if len(self._entries) > self._size:
                self._entries.popitem(last=False)
        return groups


_CACHE = _GroupCache()


def token_groups(indices: torch.Tensor) -> Groups:
    return _CACHE.get(("tokens", tuple(indices.tolist())), lambda: slot_groups(indices))


def segment_groups(slots: torch.Tensor, lengths: torch.Tensor) -> Groups:
    """Groups from vLLM's per-segment metadata (runs of one slot), without exploding it per call."""
    key = ("segments", tuple(slots.tolist()), tuple(lengths.tolist()))
    return _CACHE.get(key, lambda: slot_groups(torch.repeat_interleave(slots, lengths)))


# --- the three products, over precomputed groups ---------------------------------------------------
def _shrink(inputs, weights, output, groups: Groups, scaling: float) -> None:
    dtype = output.dtype
    for slot, rows in groups:
        product = _group_product(inputs, weights, slot, rows, dtype)
        _write(output[:, : product.shape[1]], rows, scaling * product, add=False)


def _expand(inputs, weights, output, groups: Groups, add: bool) -> None:
    dtype = output.dtype
    for slot, rows in groups:
        product = _group_product(inputs, weights, slot, rows, dtype)
        width = min(product.shape[1], output.shape[1])  # adapter and model may pad differently
        _write(output[:, :width], rows, product[:, :width], add=add)


def _expand_slice(inputs, weights, output, groups: Groups, offset: int, size: int, add: bool) -> None:
    target = output[:, offset : offset + size]
    for slot, rows in groups:
        _write(target, rows, _group_product(inputs, weights, slot, rows, output.dtype), add=add)


# --- vLLM's op signatures (torch_ops/lora_ops.py) ---------------------------------------------------
def grouped_bgmv_shrink(inputs, lora_a_weights, output_tensor, lora_indices_tensor, scaling: float = 1.0):
    """output[r, :rank] = scaling * inputs[r] @ A[slot(r)].T for rows with a slot; others untouched."""
    if not _covers(output_tensor, lora_indices_tensor.shape[0]):
        return _FALLBACK["bgmv_shrink"](inputs, lora_a_weights, output_tensor, lora_indices_tensor, scaling)
    _shrink(inputs, lora_a_weights, output_tensor, token_groups(lora_indices_tensor), scaling)
    return None


def grouped_bgmv_expand(inputs, lora_b_weights, output_tensor, lora_indices_tensor, add_inputs: bool = True):
    """output[r] (+)= inputs[r] @ B[slot(r)].T (common width) for rows with a slot; others untouched."""
    if not _covers(output_tensor, lora_indices_tensor.shape[0]):
        return _FALLBACK["bgmv_expand"](inputs, lora_b_weights, output_tensor, lora_indices_tensor, add_inputs)
    _expand(inputs, lora_b_weights, output_tensor, token_groups(lora_indices_tensor), add_inputs)
    return None


def grouped_bgmv_expand_slice(
    inputs, lora_b_weights, output_tensor, lora_indices_tensor, slice_offset: int, slice_size: int, add_inputs=True
):
    """output[r, offset:offset+size] (+)= inputs[r] @ B[slot(r)].T for rows with a slot; others untouched."""
    if not _covers(output_tensor, lora_indices_tensor.shape[0]):
        fallback = _FALLBACK["bgmv_expand_slice"]
        return fallback(
            inputs, lora_b_weights, output_tensor, lora_indices_tensor, slice_offset, slice_size, add_inputs
        )
    groups = token_groups(lora_indices_tensor)
    _expand_slice(inputs, lora_b_weights, output_tensor, groups, slice_offset, slice_size, add_inputs)
    return None


def grouped_sgmv_shrink(
    inputs,
    lora_a_weights,
    output_tensor,
    b_seq_start_loc,
    seq_len_tensor,
    lora_indices_tensor,
    batches,
    max_seq_length,
    token_nums,
    scaling,
):
    if not _covers(output_tensor, token_nums):
        exploded = torch.repeat_interleave(lora_indices_tensor, seq_len_tensor)
        return _FALLBACK["bgmv_shrink"](inputs, lora_a_weights, output_tensor, exploded, scaling)
    _shrink(inputs, lora_a_weights, output_tensor, segment_groups(lora_indices_tensor, seq_len_tensor), scaling)
    return None


def grouped_sgmv_expand(
    inputs,
    lora_b_weights,
    output_tensor,
    b_seq_start_loc,
    seq_len_tensor,
    lora_indices_tensor,
    batches,
    max_seq_length,
    token_nums,
    add_inputs=False,
):
    if not _covers(output_tensor, token_nums):
        exploded = torch.repeat_interleave(lora_indices_tensor, seq_len_tensor)
        return _FALLBACK["bgmv_expand"](inputs, lora_b_weights, output_tensor, exploded, add_inputs)
    _expand(inputs, lora_b_weights, output_tensor, segment_groups(lora_indices_tensor, seq_len_tensor), add_inputs)
    return None


def grouped_sgmv_expand_slice(
    inputs,
    lora_b_weights,
    output_tensor,
    b_seq_start_loc,
    seq_len_tensor,
    lora_indices_tensor,
    batches,
    max_seq_length,
    token_nums,
    slice_offset,
    slice_size,
    add_inputs=False,
):
    if not _covers(output_tensor, token_nums):
        exploded = torch.repeat_interleave(lora_indices_tensor, seq_len_tensor)
        return _FALLBACK["bgmv_expand_slice"](
            inputs, lora_b_weights, output_tensor, exploded, slice_offset, slice_size, add_inputs
        )
    groups = segment_groups(lora_indices_tensor, seq_len_tensor)
    _expand_slice(inputs, lora_b_weights, output_tensor, groups, slice_offset, slice_size, add_inputs)
    return None


# --- one whole LoRA linear layer (PunicaWrapperCPU.add_lora_linear) ---------------------------------
def grouped_add_lora_linear(
    self, y, x, lora_a_stacked, lora_b_stacked, scale, output_slices, *, buffer=None, **kwargs
) -> None:
    """y[:, slice i] (+)= scale * x @ A_i[slot].T @ B_i[slot].T for every slice, rows grouped by slot.

    vLLM's CPU wrapper runs shrink then expand per slice through a zeroed float32 buffer, and each op
    selects the rows again; here each group's rows are selected once for all the slices (qkv has 3,
    gate_up 2) and the shrunk activations never go through the buffer. Same dtypes as vLLM's ops:
    shrink in float32, expand in y's dtype. Any shape this does not cover goes to vLLM's method.
    """
    add = kwargs.get("add_inputs", True)
    x2, y2 = x.view(-1, x.shape[-1]), y.view(-1, y.shape[-1])
    indices = self.token_lora_indices
    if not (x2.shape[0] == y2.shape[0] == indices.shape[0]) or len(lora_a_stacked) != len(output_slices):
        return _FALLBACK["add_lora_linear"](
            self, y, x, lora_a_stacked, lora_b_stacked, scale, output_slices, buffer=buffer, **kwargs
        )
    for slot, rows in token_groups(indices):
        xg = x2 if rows is None else x2.index_select(0, rows)
        if xg.dtype != torch.float32:
            xg = xg.to(torch.float32)
        offset = 0
        for lora_a, lora_b, size in zip(lora_a_stacked, lora_b_stacked, output_slices, strict=True):
            shrunk = xg @ _slot_weight(lora_a, slot, torch.float32).t()
            if scale != 1.0:
                shrunk = shrunk * scale
            if shrunk.dtype != y2.dtype:
                shrunk = shrunk.to(y2.dtype)
            target, expand = y2[:, offset : offset + size], _slot_weight(lora_b, slot, y2.dtype).t()
            if rows is None and add:
                target.addmm_(shrunk, expand)  # the whole batch on one adapter: product and add in one op
            else:
                _write(target, rows, shrunk @ expand, add=add)
            offset += size
    return None


GROUPED: dict[str, Callable] = {
    "bgmv_shrink": grouped_bgmv_shrink,
    "bgmv_expand": grouped_bgmv_expand,
    "bgmv_expand_slice": grouped_bgmv_expand_slice,
    "sgmv_shrink": grouped_sgmv_shrink,
    "sgmv_expand": grouped_sgmv_expand,
    "sgmv_expand_slice": grouped_sgmv_expand_slice,
}
# vLLM's own bgmv ops (with the -1 fix) and add_lora_linear, for the shapes the grouped path leaves
# alone; set by vllm_patches.
_FALLBACK: dict[str, Callable] = {}
