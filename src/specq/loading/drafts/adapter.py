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

from ...errors import SpecqError
from ...model.architectures import hf_tensor_names, part_rows

CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"
# peft's saved key of one factor: <prefix>.<HF module>.lora_A.weight (the prefix is peft's wrapper)
KEY = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.lora_(?P<factor>[AB])\.weight$")


@dataclass(frozen=True)
class Adapter:
    path: Path
    base: str  # the base model's ref, as specq loads it
    digest: str  # sha256 of the weights file: which adapter a cached merge holds
    # HF weight name (model.layers.0.self_attn.q_proj.weight) -> (B [out, r], A [r, in] times the
    # scale); the products B @ A are made one weight at a time, as each is merged (`delta`)
    factors: dict[str, tuple[Tensor, Tensor]]


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
        raise SpecqError(f"adapter '{path}': peft_type is {config.get('peft_type')!r}; specq "
                         "merges LORA adapters only")
    for field, what in (("use_dora", "DoRA"), ("rank_pattern", "per-module ranks"),
                        ("alpha_pattern", "per-module alphas"),
                        ("fan_in_fan_out", "fan_in_fan_out"), ("lora_bias", "LoRA biases"),
                        ("modules_to_save", "whole modules (modules_to_save)")):
        if config.get(field):
            raise SpecqError(f"adapter '{path}': {what} ({field}) is not supported; merge it with "
                             "peft first")
    base = config.get("base_model_name_or_path")
    if not isinstance(base, str) or not base.strip():
        raise SpecqError(f"adapter '{path}': {CONFIG} names no base model "
                         "(base_model_name_or_path)")
    alpha = config.get("lora_alpha")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or alpha <= 0:
        raise SpecqError(f"adapter '{path}': lora_alpha must be a positive number, got {alpha!r}")
    return config


def read(path: Path | str) -> Adapter:
    """An adapter folder's factors, the scale folded into A; every way it can
    be broken is one line."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    path = Path(path).expanduser()
    config = _config(path)
    try:
        data = (path / WEIGHTS).read_bytes()
        tensors = load(data)
    except (OSError, SafetensorError) as e:
        raise SpecqError(f"adapter '{path}': cannot read {WEIGHTS}: {e}") from None
    by_module: dict[str, dict[str, Tensor]] = {}
    for key, tensor in tensors.items():
        m = KEY.match(key)
        if m is None or tensor.dim() != 2:
            raise SpecqError(f"adapter '{path}': '{key}' is not a LoRA factor of a linear layer")
        by_module.setdefault(m["module"], {})[m["factor"]] = tensor.float()
    factors = {}
    for module, ab in sorted(by_module.items()):
        a, b = ab.get("A"), ab.get("B")
        if a is None or b is None or a.shape[0] != b.shape[1]:
            raise SpecqError(f"adapter '{path}': {module} needs lora_A [r, in] and lora_B [out, r] "
                             "of one rank r")
        rank = a.shape[0]
        factors[f"{module}.weight"] = (
            b, a * (config["lora_alpha"] / (math.sqrt(rank) if config.get("use_rslora") else rank)))
    if not factors:
        raise SpecqError(f"adapter '{path}': {WEIGHTS} holds no LoRA factors")
    return Adapter(path, config["base_model_name_or_path"],
                   hashlib.sha256(data).hexdigest(), factors)


def native_weights(adapter: Adapter, net: torch.nn.Module) -> dict[str, tuple[str, ...]]:
    """The modules of `net` (a native base) the adapter changes, by name
    (`layers.0.attention.wqkv`), each with the Hugging Face weights it stacks; an adapter weight
    that fits no module of the base, or fits one at another shape, is an error."""
    config, changed, used = net.config, {}, set()
    for name, hf in hf_tensor_names(config).items():
        parts = [adapter.factors.get(h) for h in hf]
        if all(p is None for p in parts):
            continue
        module = net.get_submodule(name.removesuffix(".weight"))
        rows = sum(p[0].shape[0] if p is not None else part_rows(h, config)
                   for p, h in zip(parts, hf))
        cols = {p[1].shape[1] for p in parts if p is not None}
        if cols != {module.in_features} or rows != module.out_features:
            raise SpecqError(f"adapter '{adapter.path}': {name.removesuffix('.weight')} is "
                             f"{[rows, *sorted(cols)]}, its base's weight "
                             f"{[module.out_features, module.in_features]}")
        changed[name.removesuffix(".weight")] = hf
        used.update(h for h, p in zip(hf, parts) if p is not None)
    stray = sorted(set(adapter.factors) - used)
    if stray:
        raise SpecqError(f"adapter '{adapter.path}': {stray[0]} is not a weight of its base "
                         f"'{adapter.base}'")
    return changed


def delta(adapter: Adapter, hf: tuple[str, ...], config) -> Tensor:
    """B @ A of the weights `hf` stacked as the native module holds them (zeros for a part the
    adapter leaves alone), float32 [out, in]."""
    parts = [adapter.factors.get(h) for h in hf]
    n_in = next(p for p in parts if p is not None)[1].shape[1]
    return torch.cat([p[0] @ p[1] if p is not None else torch.zeros(part_rows(h, config), n_in)
                      for p, h in zip(parts, hf)])


def merge_float(net: torch.nn.Module, adapter: Adapter,
                changed: dict[str, tuple[str, ...]]) -> None:
    """Add the products of the `changed` modules (`native_weights`) to their
    float weights, in place."""
    for name, hf in changed.items():
        weight = net.get_submodule(name).weight
        weight.data += delta(adapter, hf, net.config).to(weight.dtype)
