"""Execution backends: what runs a loaded model's passes, chosen once, at load, as a `Runner`
(`runner.py`) that never changes and never changes the model's modules.

- `kernels` (the default): specq's CPU kernels where they take a layer (`fastpath`: float32
  linears on f32dot panels, 2- to 8-bit weights on int8dot, and where every linear layer is on
  them, whole cached passes, the work between the linear layers included, in one C call), torch's
  ops for the rest;
- `eager`: torch's ops only, the reference (training, quantization and saving read the modules);
- `compiled`: torch.compile of padded fixed-shape chain steps, on torch's ops.

Why a runner beside the modules and not state in them: the same weights run on kernels (decoding),
eagerly (training, a teacher, the reference in tests) and compiled, side by side, and nothing has to
be undone before the modules are trained or saved.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from ..errors import SpecqError
from ..kernels import build
from ..model.llama import Llama
from . import fastpath
from .runner import CompiledRunner, ModuleRunner, Runner


@dataclass(frozen=True)
class Backend:
    name: str
    make: Callable[..., Runner]  # (net, layers=None): a runner of a native network on this backend
    about: str  # one line for --help


def _kernels(net: nn.Module, layers: tuple[int, ...] | None = None) -> Runner:
    table = fastpath.kernels(net)
    return Runner(net, "kernels", table, fastpath.layer_stack(decoder(net), table, layers), layers)


BACKENDS = {b.name: b for b in (
    Backend("kernels", _kernels,
            "specq's CPU kernels where they take a layer, torch's ops elsewhere"),
    Backend("eager", lambda net, layers=None: Runner(net, "eager", layers=layers),
            "torch's ops only (the reference)"),
    Backend("compiled", CompiledRunner,
            "torch.compile of fixed-shape chain steps (a minute per new shape)"),
)}
DEFAULT = "kernels"


def check_name(name: str) -> str:
    """A backend name, or a one-line error listing the valid ones (before any model loads)."""
    if name not in BACKENDS:
        raise SpecqError(f"unknown backend '{name}' (valid: {', '.join(BACKENDS)})")
    return name


def runner(net: nn.Module, name: str = DEFAULT, layers: tuple[int, ...] | None = None) -> Runner:
    """A runner of `net` on backend `name`; `net` is left as it is. Networks the native decoder
    does not run (transformers' modules) run on torch's ops whatever is asked, and a feature draft
    (one small layer fed the target's features) is not compiled: the runner's `backend` says what
    it runs on. `layers`: only these decoder layers of a `Llama`, in increasing order (the same
    weights as a cheaper network: a draft of the target's own layers), on the eager or kernels
    backend."""
    backend = BACKENDS[check_name(name)]
    if not native(net):
        return ModuleRunner(net, "eager")
    if backend.name == "compiled" and not isinstance(net, Llama):
        backend = BACKENDS["kernels"]
    if layers is None:
        return backend.make(net)
    layers = tuple(layers)
    count = len(net.layers) if isinstance(net, Llama) else 0
    if backend.name == "compiled" or not layers or list(layers) != sorted(set(layers)) \
            or not 0 <= layers[0] <= layers[-1] < count:
        raise ValueError(f"layers {layers}: increasing indices of a Llama's {count} layers, "
                         "on the eager or kernels backend")
    return backend.make(net, layers)


def subset(run: Runner, layers: tuple[int, ...]) -> Runner:
    """A runner of only these decoder layers of `run`'s `Llama`, on `run`'s kernel table: the same
    weights in the same kernel layouts, not a second copy of any (a draft made of a target's own
    layers beside the target). A compiled runner's subset runs on a kernel table of its own."""
    if not isinstance(run.net, Llama):
        raise ValueError(f"only a Llama's layers run in part, not a {type(run.net).__name__}'s")
    part = runner(run.net, "eager", layers)  # checks the layers
    if run.backend != "kernels":
        return part if run.backend == "eager" else runner(run.net, "kernels", layers)
    layers = part.execution.layers
    return Runner(run.net, "kernels", run.kernels,
                  fastpath.layer_stack(run.net, run.kernels, layers), layers)


def native(net: nn.Module) -> bool:
    """Whether specq's own decoder (and so its kernels) runs this network: it is one, or wraps one
    (a feature draft's layers are a `Llama` body)."""
    return decoder(net) is not None


def decoder(net: nn.Module) -> Llama | None:
    """The native decoder that runs `net`'s layers: `net` itself, or its
    `Llama` child; else None."""
    return (net if isinstance(net, Llama)
            else next((c for c in net.children() if isinstance(c, Llama)), None))


def describe(run: Runner) -> dict:
    """What each part of a model runs on: the backend, the kernel build for this CPU (and the CPU's
    model name), how many linear layers run on which kernel, and whether cached passes run as one C
    call, and where it runs only some decoder layers, how many (`--explain`)."""
    layers = run.execution.layers
    skipped = set() if layers is None else {m for i, block in enumerate(run.net.layers)
                                            if i not in layers for m in block.modules()}
    linears = Counter(run.kernels[m].name if m in run.kernels else getattr(m, "kernel", None)
                      or _torch_kernel(m)
                      for m in run.net.modules() if _is_linear(m) and m not in skipped)
    out = {"backend": run.backend, "kernel_build": build.variant(), "cpu": build.cpu_model(),
           "linear_layers": dict(linears.most_common()),
           "layer_stack": run.stack is not None}
    if layers is not None:  # a draft of some of a model's layers
        out["decoder_layers"] = f"{len(layers)} of {len(run.net.layers)}"
    return out


def _is_linear(m: nn.Module) -> bool:
    return hasattr(m, "in_features") and hasattr(m, "out_features") and not any(
        hasattr(c, "in_features") for c in m.children())


def _torch_kernel(m: nn.Module) -> str:
    weight = getattr(m, "weight", None)
    return (f"torch F.linear ({str(weight.dtype).removeprefix('torch.')})"
            if weight is not None else type(m).__name__)
