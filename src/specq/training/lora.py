"""Low-rank adapters (LoRA, trained with peft) for a draft that is someone else's model file.

Why: calibrating the 0.5B Qwen2.5-Coder draft to its 1.5B target by full fine-tuning would make a
second 0.5B-parameter copy of the file to ship; an adapter of rank 8 on every linear layer of its
blocks is a few MB, is saved in peft's own format (any peft tool reads it, and specq reads adapters
that other tools trained), and is merged into the base's weights when the draft loads, before they
are quantized (`loading/drafts/adapter.py`). The base's weights stay frozen: they are the file's
values.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from ..core.types import Model
from ..loading.refs import model_ref
from .distill import float_teacher, sequence_forward

# Hugging Face module names of the linear layers in a block, as the architectures table writes them
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def student(base: Model, rank: int, alpha: float | None = None, seed: int = 0) -> nn.Module:
    """`base` as a float transformers model of its architecture with rank-`rank` adapters on every
    linear layer of its blocks; only the adapters train. The float weights are the base's own
    (a GGUF file's dequantized exactly). `alpha` (peft's lora_alpha) defaults to twice the rank."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    hf = float_teacher(base.net)
    config = LoraConfig(r=rank, lora_alpha=alpha or 2 * rank, lora_dropout=0.0,
                        target_modules=[m for m in TARGET_MODULES
                                        if any(n.endswith(m) for n, _ in hf.named_modules())])
    return get_peft_model(hf, config)


def forward(peft_model: nn.Module, data, rows: list[int]):
    """`distill.sequence_forward` on the transformers model inside `peft_model` (its linear layers
    carry the adapters)."""
    return sequence_forward(peft_model.get_base_model(), data, rows)


def trainable(peft_model: nn.Module) -> int:
    return sum(p.numel() for p in peft_model.parameters() if p.requires_grad)


def base_name(ref: str) -> str:
    """How an adapter names its base: a built-in by its name, a local file or folder by its
    absolute path (the adapter may be moved; its base stays where it is)."""
    name = model_ref(ref).name
    path = Path(name).expanduser()
    return str(path.resolve()) if path.exists() else name


def save(peft_model: nn.Module, out: Path, base_ref: str,
         dtype: torch.dtype = torch.float16) -> None:
    """The adapter alone into the folder `out`, in peft's format (`adapter_config.json`,
    `adapter_model.safetensors`, factors in `dtype`), its base named as specq loads it."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    config = peft_model.peft_config["default"]
    config.base_model_name_or_path = base_ref
    config.save_pretrained(str(out))
    # embeddings are not adapted: no look-up of the base online
    factors = {k: v.to(dtype).contiguous()
               for k, v in get_peft_model_state_dict(peft_model,
                                                     save_embedding_layers=False).items()}
    save_file(factors, str(Path(out) / "adapter_model.safetensors"))
