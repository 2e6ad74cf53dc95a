"""Execution backends: what a loaded model's layers run on, chosen once, at load, for the whole
model, and never changed afterwards.

- `kernels` (the default): specq's CPU kernels where they take a layer (`fastpath`: float32
  linears on f32dot panels, 4/6/8-bit weights on int8dot, and where every linear layer is on them,
  whole cached passes, the work between the linear layers included, in one C call), torch's ops
  for the rest;
- `eager`: torch's ops only, the reference (training, quantization and saving read these modules);
- `compiled`: torch.compile of padded fixed-shape chain steps (`compiled`), on torch's ops.

Why one place: before, several switches on a shared model picked the kernel (packed linears, per
module flags, the layer stack), and training flipped them back on the caller's model. Now
`prepare` is the only writer, the loader its caller (and `specq distill`, which puts a GGUF
target loaded without a backend on the kernels: its teacher runs the file's blocks), and whoever
needs plain torch modules (training, calibration, a teacher) takes `plain_copy`, leaving the
caller's model as it was.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from ..errors import SpecqError
from ..kernels import build
from . import compiled, fastpath


@dataclass(frozen=True)
class Backend:
    name: str
    prepare: Callable[[nn.Module], object]  # puts a network's layers on this backend, in place
    about: str  # one line for --help


BACKENDS = {b.name: b for b in (
    Backend("kernels", fastpath.apply, "specq's CPU kernels where they take a layer, torch's ops elsewhere"),
    Backend("eager", lambda net: None, "torch's ops only (the reference)"),
    Backend("compiled", compiled.compile, "torch.compile of fixed-shape chain steps (a minute per new shape)"),
)}
DEFAULT = "kernels"


def check_name(name: str) -> str:
    """A backend name, or a one-line error listing the valid ones (before any model loads)."""
    if name not in BACKENDS:
        raise SpecqError(f"unknown backend '{name}' (valid: {', '.join(BACKENDS)})")
    return name


def prepare(net: nn.Module, name: str = DEFAULT) -> str:
    """Put `net` on backend `name`, once (again on the same one: nothing to do). Networks the native
    decoder does not run (transformers' modules) stay on torch's ops whatever is asked: the
    returned name says what it runs on."""
    backend = BACKENDS[check_name(name)]
    if not native(net):
        backend = BACKENDS["eager"]
    elif backend.name == "compiled" and not compiled.takes(net):
        backend = BACKENDS["kernels"]  # a feature draft: one small layer fed the target's features
    if getattr(net, "backend", None) is not None:
        if net.backend != backend.name:
            raise RuntimeError(f"this network already runs on the '{net.backend}' backend, not '{backend.name}'; "
                               "load the model again")
        return backend.name
    backend.prepare(net)
    net.backend = backend.name
    return backend.name


def native(net: nn.Module) -> bool:
    """Whether specq's own decoder (and so its kernels) runs this network: it is one, or wraps one
    (a feature draft's layers are a `Llama` body)."""
    from ..model.llama import Llama

    return isinstance(net, Llama) or any(isinstance(child, Llama) for child in net.children())


def plain_copy(net: nn.Module) -> nn.Module:
    """A copy of `net` on torch's ops (trainable, readable weights), whatever `net` runs on; `net`
    itself is left as it is."""
    out = copy.deepcopy(net)
    fastpath.revert(out)
    if getattr(out, "compiled_step", None) is not None:
        out.compiled_step = None
    out.backend = None
    return out


def describe(net: nn.Module) -> dict:
    """What each part of `net` runs on: the backend, the kernel build for this CPU (and the CPU's
    model name), how many linear layers run on which kernel, and whether cached passes run as one C
    call (`--explain`)."""
    linears = Counter(getattr(m, "kernel", None) or _torch_kernel(m) for m in net.modules() if _is_linear(m))
    stacks = [m.stack is not None for m in net.modules() if hasattr(m, "stack")]
    return {"backend": getattr(net, "backend", None) or "eager",
            "kernel_build": build.variant(), "cpu": build.cpu_model(),
            "linear_layers": dict(linears.most_common()),
            "layer_stack": bool(stacks) and all(stacks)}


def _is_linear(m: nn.Module) -> bool:
    return hasattr(m, "in_features") and hasattr(m, "out_features") and not any(
        hasattr(c, "in_features") for c in m.children())


def _torch_kernel(m: nn.Module) -> str:
    weight = getattr(m, "weight", None)
    return f"torch F.linear ({str(weight.dtype).removeprefix('torch.')})" if weight is not None else type(m).__name__
