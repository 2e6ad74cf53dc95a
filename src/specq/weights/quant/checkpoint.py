"""Save and load quantized models: one directory holding `model.safetensors` (every float
parameter plus each quantized layer's portable buffers `qweight`/`scales`/`zeros`/`bias`) and
`quant_config.json` (the spec and each quantized layer's bits, group size and shape).

The stored format does not depend on how layers execute, so a checkpoint saved from a simulated
model loads as packed kernels and vice versa. Loading needs a skeleton of the same architecture
(any weights); tied parameters are stored once (safetensors `save_model`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_model
from torch import nn

from ... import atomic
from .apply import quantized_layers
from .modules import from_storage, make_quant_linear
from .spec import QuantSpec, parse_spec

CONFIG_FILE = "quant_config.json"
WEIGHTS_FILE = "model.safetensors"
FORMAT = "specq-quant"
VERSION = 1


def save_quantized(model: nn.Module, spec: QuantSpec | str, directory: str | os.PathLike,
                   provenance: dict | None = None) -> Path:
    """Write `model` (quantized to `spec` by `quantize_model`) to `directory`, replacing it;
    `provenance` (how the codes were made, e.g. by `specq qad`) goes into the config as is.

    Written into a temporary sibling directory and swapped into place (`specq.atomic`), so a
    crash never leaves a half-written checkpoint under `directory`."""
    spec = parse_spec(spec) if isinstance(spec, str) else spec
    layers = {name: {"bits": m.bits, "group_size": m.group_size, "symmetric": m.symmetric,
                     "out_features": m.out_features, "in_features": m.in_features,
                     "bias": m.bias is not None}
              for name, m in quantized_layers(model).items()}
    if spec.is_float == bool(layers) or any(meta["bits"] not in (spec.bits,
                                                                 8 if spec.head_int8 else spec.bits)
                                            for meta in layers.values()):
        raise ValueError(f"model does not hold {spec} layers: quantize it with quantize_model "
                         "first")
    float_dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()}
    dtype = str(float_dtypes.pop()).removeprefix("torch.") if len(float_dtypes) == 1 else None
    config = {"format": FORMAT, "version": VERSION, "spec": str(spec), "dtype": dtype,
              "layers": layers}
    if provenance is not None:
        config["provenance"] = provenance

    def write(tmp: Path) -> None:
        save_model(model, str(tmp / WEIGHTS_FILE))
        (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=1) + "\n")

    atomic.write_dir(directory, write)
    return Path(directory)


def read_config(directory: str | os.PathLike) -> dict:
    config = json.loads((Path(directory) / CONFIG_FILE).read_text())
    if config.get("format") != FORMAT or config.get("version") != VERSION:
        raise ValueError(f"{directory} is not a {FORMAT} v{VERSION} checkpoint")
    return config


def read_spec(directory: str | os.PathLike) -> QuantSpec:
    """The spec a checkpoint was saved with."""
    return parse_spec(read_config(directory)["spec"])


def load_quantized(model: nn.Module, directory: str | os.PathLike,
                   packed: bool = True) -> nn.Module:
    """Load a checkpoint into `model`, a float skeleton of the same architecture, in place.

    The skeleton is first cast to the float dtype the model had when saved (so norms, embeddings
    and the KV cache match), quantized layers are rebuilt (packed kernels if `packed`, else
    simulated), then every tensor is loaded strictly. The skeleton may live on the meta device:
    its float weights are replaced, never read, so they need not be allocated (a float 1.5B
    skeleton is four times its int8 checkpoint)."""
    directory = Path(directory)
    config = read_config(directory)
    if config["dtype"] is not None:
        model.to(getattr(torch, config["dtype"]))
    state = read_safetensors(directory / WEIGHTS_FILE)
    for name, meta in config["layers"].items():
        linear = model.get_submodule(name)
        shape = (meta["out_features"], meta["in_features"])
        if not isinstance(linear, nn.Linear) or tuple(linear.weight.shape) != shape:
            raise ValueError(f"checkpoint layer {name!r} ({shape[0]}x{shape[1]}) does not "
                             f"match the model's {linear}")
        zeros = None if meta["symmetric"] else state[f"{name}.zeros"]
        qw = from_storage(state[f"{name}.qweight"], state[f"{name}.scales"], zeros, meta["bits"],
                          meta["group_size"], shape)
        bias = state[f"{name}.bias"] if meta["bias"] else None
        model.set_submodule(name, make_quant_linear(qw, bias, packed, linear.weight.dtype))
    assign_state(model, state)
    return model


def read_safetensors(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors file, each in memory of its own. Why not safetensors'
    tensors as they come: they map the file, and a model built on them would fault (SIGBUS, no
    Python error) once that file is truncated or rewritten in place, as a damaged cache entry is
    before it is made again."""
    with safe_open(str(path), framework="pt") as f:
        return {key: f.get_tensor(key).clone() for key in f.keys()}


def assign_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Put every tensor of `state` in place of the model's own (assigned, not copied into a
    skeleton's tensors), strictly: a parameter tied to another and stored once (safetensors'
    `save_model`) is tied again to the one stored."""
    aliases: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(p), []).append(name)
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    tied = set()
    for names in aliases.values():
        stored = [n for n in names if n in state]
        if not stored:
            continue
        tied.update(names)
        for n in names:
            owner, _, attr = n.rpartition(".")
            setattr(model.get_submodule(owner), attr, model.get_parameter(stored[0]))
    missing = [n for n in missing if n not in tied]
    if missing or unexpected:
        raise ValueError(f"the checkpoint does not match the model: missing {missing}, "
                         f"unexpected {unexpected}")
