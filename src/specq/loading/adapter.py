"""A LoRA adapter folder (peft's format: `adapter_config.json` + `adapter_model.safetensors`) as a
model: its base, named by `base_model_name_or_path` as specq loads it (a built-in, a folder, a
`.gguf` file), with the adapter's low-rank products added to the base's weights before they are
quantized. Why merged and not run beside the base: a draft is worth its cost per token, and a
merged weight costs what the base's does.

Where a merged weight goes: at a float precision into the float weight; on a GGUF file's own blocks
(`gguf-int4...`, the default for a GGUF base) the block's exact dequantized weight plus the product
is requantized to 4 bits (`file_spec.to_int4`): a file's K-quant or Q5_0 codes cannot hold a
changed weight, so an adapter on a file needs the 4-bit body, and the result is cached like it.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from ..errors import SpecqError
from ..model.architectures import hf_tensor_names, part_rows

CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"
# peft's saved key of one factor: <prefix>.<HF module>.lora_A.weight (the prefix is peft's wrapper)
KEY = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.lora_(?P<factor>[AB])\.weight$")


@dataclass(frozen=True)
class Adapter:
    path: Path
    base: str  # the base model's ref, as specq loads it
    digest: str  # sha256 of the weights file: which adapter a cached merge holds
    deltas: dict[str, Tensor]  # HF weight name (model.layers.0.self_attn.q_proj.weight) -> float32 [out, in]


def is_adapter(path: Path | str) -> bool:
    return (Path(path).expanduser() / CONFIG).is_file()


def base_ref(path: Path | str) -> str:
    """The base an adapter folder names (read from its config alone, before any weight loads)."""
    return _config(Path(path).expanduser())["base_model_name_or_path"]


def _config(path: Path) -> dict:
    where = path / CONFIG
    try:
        config = json.loads(where.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SpecqError(f"adapter '{path}': cannot read {CONFIG}: {e}") from None
    if not isinstance(config, dict):
        raise SpecqError(f"adapter '{path}': {CONFIG} is not a JSON object")
    if config.get("peft_type") != "LORA":
        raise SpecqError(f"adapter '{path}': peft_type is {config.get('peft_type')!r}; specq merges LORA adapters only")
    for field, what in (("use_dora", "DoRA"), ("rank_pattern", "per-module ranks"),
                        ("alpha_pattern", "per-module alphas"), ("fan_in_fan_out", "fan_in_fan_out"),
                        ("lora_bias", "LoRA biases"), ("modules_to_save", "whole modules (modules_to_save)")):
        if config.get(field):
            raise SpecqError(f"adapter '{path}': {what} ({field}) is not supported; merge it with peft first")
    base = config.get("base_model_name_or_path")
    if not isinstance(base, str) or not base.strip():
        raise SpecqError(f"adapter '{path}': {CONFIG} names no base model (base_model_name_or_path)")
    alpha = config.get("lora_alpha")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or alpha <= 0:
        raise SpecqError(f"adapter '{path}': lora_alpha must be a positive number, got {alpha!r}")
    return config


def read(path: Path | str) -> Adapter:
    """An adapter folder's products B @ A * scale per weight; every way it can be broken is one line."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path).expanduser()
    config = _config(path)
    weights = path / WEIGHTS
    try:
        tensors = load_file(weights)
        digest = hashlib.sha256(weights.read_bytes()).hexdigest()
    except (OSError, SafetensorError) as e:
        raise SpecqError(f"adapter '{path}': cannot read {WEIGHTS}: {e}") from None
    factors: dict[str, dict[str, Tensor]] = {}
    for key, tensor in tensors.items():
        m = KEY.match(key)
        if m is None or tensor.dim() != 2:
            raise SpecqError(f"adapter '{path}': '{key}' is not a LoRA factor of a linear layer")
        factors.setdefault(m["module"], {})[m["factor"]] = tensor.float()
    deltas = {}
    for module, ab in sorted(factors.items()):
        a, b = ab.get("A"), ab.get("B")
        if a is None or b is None or a.shape[0] != b.shape[1]:
            raise SpecqError(f"adapter '{path}': {module} needs lora_A [r, in] and lora_B [out, r] of one rank r")
        rank = a.shape[0]
        scale = config["lora_alpha"] / (math.sqrt(rank) if config.get("use_rslora") else rank)
        deltas[f"{module}.weight"] = (b @ a) * scale
    if not deltas:
        raise SpecqError(f"adapter '{path}': {WEIGHTS} holds no LoRA factors")
    return Adapter(path, config["base_model_name_or_path"], digest, deltas)


def native_deltas(adapter: Adapter, config) -> dict[str, Tensor]:
    """The adapter's products in the native layout of a base of `config` (fused weights get their
    parts' products stacked, zeros for a part the adapter leaves alone), by native parameter name
    without `.weight`; a product that fits no weight of the base is an error."""
    native, used = {}, set()
    for name, hf in hf_tensor_names(config).items():
        parts = [adapter.deltas.get(h) for h in hf]
        if all(p is None for p in parts):
            continue
        n_in = next(p for p in parts if p is not None).shape[1]
        native[name.removesuffix(".weight")] = torch.cat(
            [p if p is not None else torch.zeros(part_rows(h, config), n_in) for p, h in zip(parts, hf)])
        used.update(h for h, p in zip(hf, parts) if p is not None)
    stray = sorted(set(adapter.deltas) - used)
    if stray:
        raise SpecqError(f"adapter '{adapter.path}': {stray[0]} is not a weight of its base '{adapter.base}'")
    return native


def merge_float(net: torch.nn.Module, deltas: dict[str, Tensor], where: str) -> None:
    """Add each product to the float weight of the module of its name, in place."""
    for name, delta in deltas.items():
        weight = net.get_submodule(name).weight
        if weight.shape != delta.shape:
            raise SpecqError(f"adapter '{where}': {name} is {list(delta.shape)}, its base's weight "
                             f"{list(weight.shape)}")
        weight.data += delta.to(weight.dtype)
