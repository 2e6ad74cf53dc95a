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


@pytest.mark.parametrize("backend", ["eager", "kernels"])
def test_a_runner_of_some_layers_runs_the_model_cut_to_them(backend):
    """`layers=(0, 3)`: the same weights as a two-layer network (a draft made of the target's own
    layers), with a cache of two layers: a prefill, a chain and a step give the logits of the model
    cut to those layers, bit for bit; the whole model's differ; the modules stay as they were."""
    import copy
    from dataclasses import replace

    net = tiny_model(hidden=64, layers=4, scale=3.0).net
    cut = copy.deepcopy(net)
    cut.layers = torch.nn.ModuleList(cut.layers[i] for i in (0, 3))
    cut.config = replace(cut.config, num_layers=2)
    part = backends.runner(net, backend, layers=(0, 3))
    want, whole = backends.runner(cut, backend), backends.runner(net, backend)
    assert (part.stack is not None) == (backend == "kernels" and decoder.available())
    ids = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6])
    with torch.inference_mode():
        caches = [run.new_cache(16) for run in (part, want, whole)]
        assert caches[0].k.shape[0] == 2 and caches[2].k.shape[0] == 4
        out = [[run(ids[:4], c), run(ids[4:7], c), run(ids[7:], c)]
               for run, c in zip((part, want, whole), caches)]
    assert all(torch.equal(a, b) for a, b in zip(out[0], out[1]))
    assert not torch.allclose(out[0][1], out[2][1], atol=1e-3)
    assert len(net.layers) == 4 and net.config.num_layers == 4
    for layers in ((), (3, 0), (1, 1), (0, 4)):
        with pytest.raises(ValueError, match="increasing indices"):
            backends.runner(net, backend, layers=layers)


@pytest.mark.parametrize("backend", ["eager", "kernels"])
def test_a_subset_of_a_runner_shares_its_kernels(backend):
    """`subset`: the layers of a loaded model's runner on that runner's own kernel table (no
    second copy of a weight), computing what a fresh runner of those layers computes, bit for bit,
    and described as those layers; a network that is not a Llama has no layers to run in part."""
    net = tiny_model(hidden=64, layers=4, scale=3.0).net
    whole = backends.runner(net, backend)
    part, fresh = backends.subset(whole, (0, 2, 3)), backends.runner(net, backend, (0, 2, 3))
    assert part.net is net and part.backend == backend
    assert part.kernels is whole.kernels if backend == "kernels" else not part.kernels
    assert (part.stack is not None) == (backend == "kernels" and decoder.available())
    ids = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6])
    with torch.inference_mode():
        caches = [run.new_cache(16) for run in (part, fresh)]
        out = [[run(ids[:5], c), run(ids[5:6], c), run(ids[6:], c), run(ids, None)]
               for run, c in zip((part, fresh), caches)]
    assert all(torch.equal(a, b) for a, b in zip(*out)) and caches[0].k.shape[0] == 3
    described = backends.describe(part)  # --explain: the layers it runs, and their linear layers
    assert described["decoder_layers"] == "3 of 4" and "decoder_layers" not in backends.describe(
        whole) and sum(described["linear_layers"].values()) == 3 * 4 + 1
    with pytest.raises(ValueError, match="increasing indices"):
        backends.subset(whole, (2, 1))
    with pytest.raises(ValueError, match="only a Llama"):
        backends.subset(backends.runner(torch.nn.Linear(2, 2), backend), (0,))
