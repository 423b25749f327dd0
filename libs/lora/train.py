"""LoRA training and construction with peft, shared by the trainer service, the eval gate's
parity checks and the tests. Deterministic given a seed; runs on CPU here and on GPU when present."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from libs.lora.format import CONFIG_FILE, WEIGHTS_FILE

log = logging.getLogger(__name__)

DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
StepCallback = Callable[[int, int, float], None]  # (step, total, loss)


@dataclass
class LoraRecipe:
    rank: int = 16
    alpha: int = 32
    target_modules: Sequence[str] = DEFAULT_TARGETS
    dropout: float = 0.0
    steps: int = 30
    learning_rate: float = 2e-3
    batch_size: int = 4
    max_length: int = 256
    seed: int = 0
    extra: dict = field(default_factory=dict)
    layers: Sequence[int] | None = None  # None: every layer; else only these (small adapters for fleet tests)


def _load_base(base_path: Path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(base_path)
    model = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    return tok, model


def _peft_config(recipe: LoraRecipe):
    from peft import LoraConfig

    layers = list(recipe.layers) if recipe.layers is not None else None
    return LoraConfig(
        r=recipe.rank,
        lora_alpha=recipe.alpha,
        target_modules=list(recipe.target_modules),
        lora_dropout=recipe.dropout,
        bias="none",
        task_type="CAUSAL_LM",
        layers_to_transform=layers,
    )


def _seed_everything(seed: int) -> None:
    import torch

    random.seed(seed)
    torch.manual_seed(seed)


def save_adapter(peft_model, out_dir: Path) -> Path:
    """Save only the two files of the loraplex adapter format (no README, safetensors only)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    peft_model.save_pretrained(out_dir, safe_serialization=True)
    (out_dir / "README.md").unlink(missing_ok=True)
    assert (out_dir / CONFIG_FILE).exists() and (out_dir / WEIGHTS_FILE).exists()
    return out_dir


def random_adapter(base_path: Path, out_dir: Path, recipe: LoraRecipe | None = None, scale: float = 0.02) -> Path:
    """An adapter with random A and B (PEFT initialises B to zero, which would be a no-op adapter)."""
    recipe = recipe or LoraRecipe()
    return random_adapters(base_path, {recipe.seed: out_dir}, recipe, scale)[0]


def random_adapters(
    base_path: Path, out_dirs: dict[int, Path], recipe: LoraRecipe | None = None, scale: float = 0.02
) -> list[Path]:
    """Several random adapters (one per seed) from one load of the base model."""
    import torch
    from peft import get_peft_model

    recipe = recipe or LoraRecipe()
    _, model = _load_base(base_path)
    peft_model = get_peft_model(model, _peft_config(recipe))
    _set_base_name(peft_model, base_path)
    written = []
    for seed, out_dir in out_dirs.items():
        _seed_everything(seed)
        with torch.no_grad():
            for name, param in peft_model.named_parameters():
                if "lora_" in name:
                    param.normal_(0.0, scale)
        written.append(save_adapter(peft_model, out_dir))
    return written


def training_device(device: str = "auto") -> str:
    import torch

    return ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device


def train_adapter(
    base_path: Path,
    examples: Sequence[dict],
    out_dir: Path,
    recipe: LoraRecipe | None = None,
    on_step: StepCallback | None = None,
    device: str = "auto",
) -> tuple[Path, list[float]]:
    """Train a LoRA on chat examples ({"messages": [...]}, loss on the assistant turns only), on the
    GPU when there is one (float32 weights either way: the saved adapter does not depend on it)."""
    import torch
    from peft import get_peft_model

    recipe = recipe or LoraRecipe()
    device = training_device(device)
    _seed_everything(recipe.seed)
    tok, model = _load_base(base_path)
    peft_model = get_peft_model(model.to(device), _peft_config(recipe))
    batches = [encode_chat(tok, ex["messages"], recipe.max_length) for ex in examples]
    if not batches:
        raise ValueError("no training examples")
    optimizer = torch.optim.AdamW([p for p in peft_model.parameters() if p.requires_grad], lr=recipe.learning_rate)
    rng = random.Random(recipe.seed)
    losses: list[float] = []
    peft_model.train()
    for step in range(1, recipe.steps + 1):
        picked = [batches[rng.randrange(len(batches))] for _ in range(recipe.batch_size)]
        input_ids, labels, attention = (t.to(device) for t in _collate(picked, tok.pad_token_id or 0))
        loss = peft_model(input_ids=input_ids, attention_mask=attention, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
        if on_step:
            on_step(step, recipe.steps, losses[-1])
    peft_model.eval()
    _set_base_name(peft_model, base_path)
    return save_adapter(peft_model.to("cpu"), out_dir), losses


def encode_chat(tok, messages: Sequence[dict], max_length: int) -> tuple[list[int], list[int]]:
    """Token ids and labels; labels are -100 except on the final assistant reply."""
    if not messages or messages[-1]["role"] != "assistant":
        raise ValueError("a training example must end with an assistant message")
    prompt_ids = tok.apply_chat_template(list(messages[:-1]), add_generation_prompt=True, tokenize=True)
    if isinstance(prompt_ids, dict) or hasattr(prompt_ids, "input_ids"):
        prompt_ids = prompt_ids["input_ids"]
    answer_ids = tok.encode(messages[-1]["content"], add_special_tokens=False) + [tok.eos_token_id]
    ids = (list(prompt_ids) + answer_ids)[:max_length]
    labels = ([-100] * len(prompt_ids) + answer_ids)[:max_length]
    return ids, labels


def _collate(batch, pad_id: int):
    import torch

    width = max(len(ids) for ids, _ in batch)
    input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    labels = torch.full((len(batch), width), -100, dtype=torch.long)
    attention = torch.zeros((len(batch), width), dtype=torch.long)
    for row, (ids, labs) in enumerate(batch):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        labels[row, : len(labs)] = torch.tensor(labs)
        attention[row, : len(ids)] = 1
    return input_ids, labels, attention


def _set_base_name(peft_model, base_path: Path) -> None:
    # Record the catalogue name, not a machine-local path, so equal weights give equal digests
    # wherever they were trained.
    for cfg in peft_model.peft_config.values():
        cfg.base_model_name_or_path = Path(base_path).name


def peft_generate(base_path: Path, adapter_dir: Path | None, messages: Sequence[dict], max_new_tokens: int = 32) -> str:
    """Greedy reference generation with transformers + peft (the parity baseline for vLLM)."""
    tok, ids = peft_generate_ids(base_path, adapter_dir, [messages], max_new_tokens)
    return tok.decode(ids[0], skip_special_tokens=True)


def peft_generate_ids(
    base_path: Path, adapter_dir: Path | None, conversations: Sequence[Sequence[dict]], max_new_tokens: int = 32
) -> tuple[object, list[list[int]]]:
    """Greedy token ids generated by transformers + peft for each conversation (one model load),
    without the end-of-sequence token; returns (tokenizer, ids)."""
    import torch
    from peft import PeftModel

    tok, model = _load_base(base_path)
    if adapter_dir is not None:
        model = PeftModel.from_pretrained(model, adapter_dir)
    model.eval()
    outputs = []
    for messages in conversations:
        ids = tok.apply_chat_template(list(messages), add_generation_prompt=True, return_tensors="pt", return_dict=True)
        with torch.no_grad():
            out = model.generate(
                **ids, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tok.pad_token_id or tok.eos_token_id
            )
        new = out[0, ids["input_ids"].shape[1] :].tolist()
        outputs.append(new[: new.index(tok.eos_token_id)] if tok.eos_token_id in new else new)
    return tok, outputs
