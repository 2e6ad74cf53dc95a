"""Quantize a whole model in place, and account for its weight bytes.

Targets are chosen by module name: every `nn.Linear` except the output head (a module named
`output` or `lm_head`) unless the spec says `-head`. RTN works on any module; GPTQ and AWQ
calibrate decoder blocks and so need the `specq.model.llama.Llama` layout.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

from torch import Tensor, nn
from tqdm.auto import tqdm

from .modules import FileBlocks, QuantLinear, make_quant_linear
from .rtn import QuantizedWeight, quantize_rtn
from .sequential import CalibrationConfig, quantize_calibrated
from .spec import QuantSpec, parse_spec

HEAD_NAMES = ("output", "lm_head")
MIN_FALLBACK_GROUP = 32


def quant_targets(model: nn.Module, spec: QuantSpec) -> dict[str, nn.Linear]:
    """The linears `spec` quantizes, by name."""
    return {name: m for name, m in model.named_modules() if isinstance(m, nn.Linear)
            and (spec.quantize_head or name.rsplit(".", 1)[-1] not in HEAD_NAMES)}


def layer_group_sizes(targets: dict[str, nn.Linear], spec: QuantSpec) -> dict[str, int]:
    """Each target's group size. The spec's group size is an upper bound: where it does not
    divide a layer's in_features, the layer uses gcd(group, in_features) (so every fallback group
    still splits a requested group evenly; e.g. g128 on SmolLM2's 576-wide layers gives g64, which
    the int4 kernel runs) with a warning. Below MIN_FALLBACK_GROUP that would cost too many
    scales, so it is a ValueError naming the layer."""
    sizes, fallbacks = {}, {}
    for name, m in targets.items():
        group = spec.group_size or m.in_features
        if m.in_features % group:
            fallback = math.gcd(group, m.in_features)
            if fallback < MIN_FALLBACK_GROUP:
                raise ValueError(f"group size {group} does not divide in_features={m.in_features} "
                                 f"of layer {name!r} ({m.out_features}x{m.in_features}) and the "
                                 f"largest group that splits both is {fallback}; pick a divisor or "
                                 "drop -g for per-channel scales")
            fallbacks.setdefault((m.in_features, fallback), []).append(name)
            group = fallback
        sizes[name] = group
    for (n_in, group), names in fallbacks.items():
        warnings.warn(f"{spec}: group size {spec.group_size} does not divide in_features={n_in}; "
                      f"using group {group} for {len(names)} layers ({names[0]}, ...)",
                      stacklevel=3)
    return sizes


def quantize_model(model: nn.Module, spec: QuantSpec | str,
                   calibration: Sequence[Tensor] | None = None, packed: bool = True,
                   progress: bool = True,
                   config: CalibrationConfig = CalibrationConfig()) -> nn.Module:
    """Quantize `model` in place to `spec` and return it.

    A float spec just casts the model. Otherwise each target linear becomes a `QuantLinear`:
    with `packed`, the fastest kernel that accepts it (int8 kernel; int4 kernel for 2-4 bits;
    else dequantized bf16); without, the simulated reference (dequantized weights in the
    layer's dtype). `module.kernel` says which.
    `calibration`: 1-D token-id tensors (see `calibration_samples`), required by GPTQ and AWQ.
    Casting to a float dtype should happen before this call: the packed kernels are bf16 CPU
    kernels and ignore later casts."""
    spec = parse_spec(spec) if isinstance(spec, str) else spec
    if spec.is_float:
        return model.to(spec.dtype)
    targets = quant_targets(model, spec)
    group_sizes = layer_group_sizes(targets, spec)
    biases = {name: m.bias for name, m in targets.items()}
    dtypes = {name: m.weight.dtype for name, m in targets.items()}
    with tqdm(total=len(targets), desc=f"quantize {spec}", disable=not progress) as bar:
        if spec.method == "rtn":
            quantized: dict[str, QuantizedWeight] = {}
            for name in targets:
                quantized[name] = quantize_rtn(targets[name].weight, spec.bits,
                                               group_sizes[name], spec.symmetric)
                bar.update()
        else:
            quantized = quantize_calibrated(model, spec, calibration or [], targets,
                                            group_sizes, config, lambda _name: bar.update())
    # no reference kept to a float linear or to its codes once its module replaces it: the float
    # model, every layer's codes and the packed modules are never all held at once
    del targets
    for name in list(quantized):
        qw = quantized.pop(name)
        model.set_submodule(name, make_quant_linear(qw, biases[name], packed, dtypes[name]))
    if spec.head_int8:
        for name, m in head_linears(model).items():
            qw = quantize_rtn(m.weight, 8, m.in_features, symmetric=True)
            model.set_submodule(name, make_quant_linear(qw, m.bias, packed, m.weight.dtype))
    return model


def head_linears(model: nn.Module) -> dict[str, nn.Linear]:
    """The float output head(s) of `model`, by name."""
    return {name: m for name, m in model.named_modules()
            if isinstance(m, nn.Linear) and name.rsplit(".", 1)[-1] in HEAD_NAMES}


@dataclass(frozen=True)
class WeightBytes:
    """Bytes of weights as stored (what a checkpoint holds) and as executed (what forward reads)."""

    stored: int
    executed: int


def weight_bytes(model: nn.Module) -> WeightBytes:
    """Quantized layers count their own storage/execution forms; float parameters count once
    each (a tied embedding/head is one tensor)."""
    stored = executed = sum(p.nbytes for p in model.parameters())
    for m in model.modules():
        if isinstance(m, (QuantLinear, FileBlocks)):
            stored += m.stored_bytes()
            executed += m.executed_bytes()
    return WeightBytes(stored, executed)


def quantized_layers(model: nn.Module) -> dict[str, QuantLinear]:
    return {name: m for name, m in model.named_modules() if isinstance(m, QuantLinear)}
