"""One backend per loaded model: chosen once, never changed, visible; plain copies for training."""

from __future__ import annotations

import pytest
import torch

from specq import backends
from specq.backends import fastpath
from specq.errors import SpecqError
from specq.kernels import build, decoder

from conftest import tiny_model


def test_a_network_takes_one_backend_once():
    net = tiny_model(hidden=64).net
    assert backends.prepare(net, "eager") == "eager"
    assert backends.prepare(net, "eager") == "eager"  # again on the same one: nothing changes
    with pytest.raises(RuntimeError, match="already runs on the 'eager' backend, not 'kernels'"):
        backends.prepare(net, "kernels")


def test_unknown_backend_is_one_line():
    with pytest.raises(SpecqError, match=r"unknown backend 'fast' \(valid: kernels, eager, compiled\)"):
        backends.check_name("fast")


@pytest.mark.skipif(not decoder.available(), reason="needs AVX2 and a C compiler")
def test_describe_says_what_each_layer_runs_on():
    eager, fast = tiny_model(hidden=64).net, tiny_model(hidden=64).net
    backends.prepare(eager, "eager")
    backends.prepare(fast, "kernels")
    plain, kernels = backends.describe(eager), backends.describe(fast)
    assert plain["backend"] == "eager" and not plain["layer_stack"]
    assert plain["linear_layers"] == {"torch F.linear (float32)": 2 * 4 + 1}  # 4 per layer, the head
    assert kernels["backend"] == "kernels" and kernels["layer_stack"]
    assert kernels["kernel_build"] == build.variant() and kernels["cpu"] == build.cpu_model()
    assert sum(kernels["linear_layers"].values()) == 9 and all("f32dot" in k for k in kernels["linear_layers"])


@pytest.mark.skipif(not decoder.available(), reason="needs AVX2 and a C compiler")
def test_a_plain_copy_leaves_the_model_on_its_kernels():
    model = tiny_model(hidden=64)
    backends.prepare(model.net, "kernels")
    ids = torch.tensor([1, 2, 3, 4])
    with torch.inference_mode():
        before = model.net(ids, None)
    copy = backends.plain_copy(model.net)
    assert any(isinstance(m, fastpath.PackedLinear) for m in model.net.modules())
    assert not any(isinstance(m, fastpath.PackedLinear) for m in copy.modules())
    assert copy.backend is None and model.net.backend == "kernels"
    linears = [m for m in copy.modules() if type(m) is torch.nn.Linear]
    assert len(linears) == 9 and all(isinstance(m.weight, torch.nn.Parameter) for m in linears)
    with torch.inference_mode():
        assert torch.allclose(copy(ids, None), before, atol=1e-5)
        assert torch.equal(model.net(ids, None), before)


def test_the_cli_help_names_every_backend():
    from specq.cli import BACKEND_HELP

    assert all(name in BACKEND_HELP for name in backends.BACKENDS)


def test_explain_names_the_kernel_build_and_the_cpu():
    from rich.console import Console

    from specq.report import print_backends

    described = {"backend": "kernels", "kernel_build": "avx2", "linear_layers": {"int8dot": 3, "f32dot": 1},
                 "layer_stack": True}
    for cpu, shown in (("Some CPU @ 2.0GHz", "kernel build avx2 for Some CPU @ 2.0GHz, "), (None, "kernel build avx2, ")):
        console = Console(record=True, width=200)
        print_backends({"m": dict(described, cpu=cpu)}, console)
        text = console.export_text()
        assert shown in text and "3 linear layers: int8dot" in text and "1 linear layer: f32dot" in text
