"""One runner per loaded model: chosen once, never changed, visible, leaving
the modules as loaded."""

from __future__ import annotations

import pytest
import torch

from specq import backends
from specq.errors import SpecqError
from specq.kernels import build, decoder

from conftest import tiny_model


def test_a_runner_leaves_the_modules_as_they_were():
    """Making a runner changes nothing in the network: no module swapped, no state set, the same
    outputs on torch's ops after as before; and two runners of one network run side by side."""
    net = tiny_model(hidden=64).net
    before = {name: type(m) for name, m in net.named_modules()}
    state = {k: v.clone() for k, v in net.state_dict().items()}
    ids = torch.tensor([1, 2, 3, 4])
    with torch.inference_mode():
        eager = net(ids, None)
        fast = backends.runner(net, "kernels")
        plain = backends.runner(net, "eager")
        assert fast.backend == "kernels" and plain.backend == "eager"
        assert {name: type(m) for name, m in net.named_modules()} == before
        assert all(torch.equal(v, state[k]) for k, v in net.state_dict().items())
        assert not any(hasattr(net, name) for name in ("stack", "backend", "compiled_step"))
        assert torch.equal(net(ids, None), eager) and torch.equal(plain(ids, None), eager)
        assert torch.allclose(fast(ids, None), eager, atol=1e-5)
    if decoder.available():
        assert fast.stack is not None and len(fast.kernels) == 2 * 4 + 1 and plain.stack is None


def test_unknown_backend_is_one_line():
    with pytest.raises(SpecqError,
                       match=r"unknown backend 'fast' \(valid: kernels, eager, compiled\)"):
        backends.check_name("fast")


@pytest.mark.skipif(not decoder.available(), reason="needs AVX2 and a C compiler")
def test_describe_says_what_each_layer_runs_on():
    net = tiny_model(hidden=64).net
    plain, kernels = (backends.describe(backends.runner(net, name))
                      for name in ("eager", "kernels"))
    assert plain["backend"] == "eager" and not plain["layer_stack"]
    # 4 per layer, the head
    assert plain["linear_layers"] == {"torch F.linear (float32)": 2 * 4 + 1}
    assert kernels["backend"] == "kernels" and kernels["layer_stack"]
    assert kernels["kernel_build"] == build.variant() and kernels["cpu"] == build.cpu_model()
    assert (sum(kernels["linear_layers"].values()) == 9
            and all("f32dot" in k for k in kernels["linear_layers"]))


def test_the_cli_help_names_every_backend():
    from specq.cli import BACKEND_HELP

    assert all(name in BACKEND_HELP for name in backends.BACKENDS)


def test_explain_names_the_kernel_build_and_the_cpu():
    from rich.console import Console

    from specq.report import print_backends

    described = {"backend": "kernels", "kernel_build": "avx2",
                 "linear_layers": {"int8dot": 3, "f32dot": 1}, "layer_stack": True}
    for cpu, shown in (("Some CPU @ 2.0GHz", "kernel build avx2 for Some CPU @ 2.0GHz, "),
                       (None, "kernel build avx2, ")):
        console = Console(record=True, width=200)
        print_backends({"m": dict(described, cpu=cpu)}, console)
        text = console.export_text()
        assert (shown in text and "3 linear layers: int8dot" in text
                and "1 linear layer: f32dot" in text)
