"""libs.lora.validate and the registry's push rules against a tiny base spec (no servers)."""

from __future__ import annotations

import numpy as np
import pytest

from libs.lora.format import read_adapter
from libs.lora.validate import AdapterInvalid, Policy, canonical_dtype, validate_adapter
from services.registry.errors import Invalid, TooLarge
from services.registry.validation import check_base_match, validate_upload
from tests.unit.registry.synth import TINY, tensors_for, write_adapter, write_torch_adapter


def refused_code(directory, policy=Policy()) -> str:
    with pytest.raises(AdapterInvalid) as caught:
        validate_adapter(read_adapter(directory), TINY, policy)
    return caught.value.code


def test_a_consistent_adapter_passes(tmp_path):
    validate_adapter(read_adapter(write_adapter(tmp_path / "ok")), TINY)


def test_rank_over_the_pool_limit_names_the_limit(tmp_path):
    directory = write_adapter(tmp_path / "r32", rank=32)
    with pytest.raises(AdapterInvalid, match=r"rank 32 exceeds this pool's limit of max_rank=16") as caught:
        validate_adapter(read_adapter(directory), TINY, Policy(max_rank=16))
    assert caught.value.code == "rank_too_high"
    validate_adapter(read_adapter(directory), TINY, Policy(max_rank=32))  # a rank-32 pool takes it


def test_target_not_in_the_base_is_refused(tmp_path):
    assert (
        refused_code(
            write_adapter(tmp_path / "t", modules=("q_proj", "lm_head"), tensors=tensors_for(TINY, 4, ["q_proj"]))
        )
        == "unsupported_target"
    )


def test_tensors_for_an_undeclared_module_are_refused(tmp_path):
    tensors = tensors_for(TINY, 4, ["q_proj", "v_proj", "k_proj"])
    assert refused_code(write_adapter(tmp_path / "t", tensors=tensors)) == "unsupported_target"


@pytest.mark.parametrize("targets", ["all-linear", [], None, [1, 2]])
def test_targets_must_be_an_explicit_list(tmp_path, targets):
    assert refused_code(write_adapter(tmp_path / "t", target_modules=targets)) == "bad_targets"


def test_wrong_shape_is_refused_with_both_shapes(tmp_path):
    tensors = tensors_for(TINY, 4, ["q_proj", "v_proj"])
    key = "base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight"
    tensors[key] = np.zeros((8, 4), dtype=np.float32)  # v_proj's out is the KV dim (4), not 8
    with pytest.raises(AdapterInvalid, match=r"\[8, 4\] does not match \[4, 4\]"):
        validate_adapter(read_adapter(write_adapter(tmp_path / "s", tensors=tensors)), TINY)


def test_rank_dimension_must_equal_r(tmp_path):
    tensors = tensors_for(TINY, 8, ["q_proj", "v_proj"])  # tensors at rank 8, config says 4
    assert refused_code(write_adapter(tmp_path / "r", rank=4, tensors=tensors)) == "shape_mismatch"


def test_layer_beyond_the_base_is_refused(tmp_path):
    tensors = tensors_for(TINY, 4, ["q_proj", "v_proj"])
    tensors["base_model.model.model.layers.7.self_attn.q_proj.lora_A.weight"] = np.zeros((4, 8), dtype=np.float32)
    tensors["base_model.model.model.layers.7.self_attn.q_proj.lora_B.weight"] = np.zeros((8, 4), dtype=np.float32)
    with pytest.raises(AdapterInvalid, match="layer 7 does not exist"):
        validate_adapter(read_adapter(write_adapter(tmp_path / "l", tensors=tensors)), TINY)


def test_a_without_b_is_refused(tmp_path):
    tensors = tensors_for(TINY, 4, ["q_proj", "v_proj"])
    del tensors["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"]
    with pytest.raises(AdapterInvalid, match="in pairs"):
        validate_adapter(read_adapter(write_adapter(tmp_path / "p", tensors=tensors)), TINY)


def test_dtype_policy(tmp_path):
    f16 = write_adapter(tmp_path / "f16", tensors=tensors_for(TINY, 4, ["q_proj", "v_proj"], dtype=np.float16))
    validate_adapter(read_adapter(f16), TINY)
    assert refused_code(f16, Policy(allowed_dtypes=("float32",))) == "dtype_not_allowed"
    f64 = write_adapter(tmp_path / "f64", tensors=tensors_for(TINY, 4, ["q_proj", "v_proj"], dtype=np.float64))
    assert refused_code(f64) == "dtype_not_allowed"


def test_mixed_dtypes_are_refused(tmp_path):
    tensors = tensors_for(TINY, 4, ["q_proj", "v_proj"])
    key = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
    tensors[key] = tensors[key].astype(np.float16)
    assert refused_code(write_adapter(tmp_path / "m", tensors=tensors)) == "mixed_dtypes"


@pytest.mark.parametrize(
    ("dtype", "value"), [(np.float32, np.nan), (np.float32, -np.inf), (np.float16, np.inf), (np.float16, np.nan)]
)
def test_non_finite_values_are_refused(tmp_path, dtype, value):
    tensors = tensors_for(TINY, 4, ["q_proj", "v_proj"], dtype=dtype)
    key = next(k for k in tensors if k.endswith("v_proj.lora_B.weight"))
    tensors[key][2, 3] = value
    with pytest.raises(AdapterInvalid, match="NaN or Inf") as caught:
        validate_adapter(read_adapter(write_adapter(tmp_path / "n", tensors=tensors)), TINY)
    assert key in caught.value.message


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_bfloat16_is_found_without_a_numpy_dtype(tmp_path, value):
    torch = pytest.importorskip("torch")
    tensors = {k: torch.from_numpy(v).to(torch.bfloat16) for k, v in tensors_for(TINY, 4, ["q_proj", "v_proj"]).items()}
    clean = write_torch_adapter(tmp_path / "clean", dict(tensors))
    validate_adapter(read_adapter(clean), TINY)
    key = sorted(tensors)[0]
    tensors[key] = tensors[key].clone()
    tensors[key][0, 0] = value
    assert refused_code(write_torch_adapter(tmp_path / "dirty", tensors)) == "non_finite"


def test_largest_finite_values_are_not_mistaken_for_inf(tmp_path):
    tensors = tensors_for(TINY, 4, ["q_proj", "v_proj"])
    first = sorted(tensors)[0]
    tensors[first][0, 0] = np.finfo(np.float32).max
    tensors[first][0, 1] = -np.finfo(np.float32).tiny
    validate_adapter(read_adapter(write_adapter(tmp_path / "max", tensors=tensors)), TINY)


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"peft_type": "IA3"}, "not_lora"),
        ({"use_dora": True}, "unsupported_feature"),
        ({"rank_pattern": {"q_proj": 8}}, "unsupported_feature"),
        ({"modules_to_save": ["lm_head"]}, "unsupported_feature"),
        ({"bias": "all"}, "unsupported_feature"),
        ({"r": "4"}, "bad_config"),
        ({"lora_alpha": 0}, "bad_config"),
    ],
)
def test_config_features_the_engine_cannot_apply(tmp_path, change, code):
    tensors = tensors_for(TINY, 4, ["q_proj", "v_proj"])
    assert refused_code(write_adapter(tmp_path / "c", tensors=tensors, **change)) == code


def test_canonical_dtype_names():
    assert [canonical_dtype(t) for t in ("F32", "BF16", "F16", "F64")] == ["float32", "bfloat16", "float16", "float64"]


# --- the registry's push rules on top ------------------------------------------------------------
def test_push_refuses_pickles_before_reading_them(tmp_path):
    directory = write_adapter(tmp_path / "p")
    (directory / "adapter_model.bin").write_bytes(b"\x80\x04 never unpickled")
    with pytest.raises(Invalid, match="pickled weight files are refused") as caught:
        validate_upload(directory, TINY, Policy(), max_bytes=1 << 20)
    assert caught.value.code == "bad_layout"


def test_push_refuses_oversize(tmp_path):
    directory = write_adapter(tmp_path / "big")
    with pytest.raises(TooLarge, match="over the limit of 100 bytes"):
        validate_upload(directory, TINY, Policy(), max_bytes=100)


@pytest.mark.parametrize(
    ("declared", "ok"),
    [
        ("tiny", True),
        ("/data/models/tiny", True),
        ("", True),
        ("smollm2-135m", False),
        ("meta-llama/Llama-3.1-8B", False),
    ],
)
def test_base_named_in_the_config_must_match(tmp_path, declared, ok):
    files = read_adapter(write_adapter(tmp_path / "b", base_model_name_or_path=declared))
    if ok:
        check_base_match(files, TINY)
    else:
        with pytest.raises(Invalid, match="trained for base") as caught:
            check_base_match(files, TINY)
        assert caught.value.code == "base_mismatch"
