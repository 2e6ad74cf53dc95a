"""kernels/decoder: `Stack`, every decoder layer of a cached pass in one C call, on every kernel
variant this CPU runs: the torch modules' math for every feature of the Llama family (within float
tolerance, and far from the same model without the feature), verify rows bit-identical to one-token
steps, stacked sequences bit-identical to their own passes, and where the stack is not made."""

from __future__ import annotations

import copy

import pytest
import torch

from specq import backends
from specq.backends import fastpath
from specq.core.acceptance import verify_layout
from specq.kernels import build, decoder
from specq.kernels.rows import ROW_BY_ROW_MAX
from specq.model.llama import Rows
from specq.weights.quant import quantize_model

from conftest import counting_stack, tiny_model, without_stack

pytestmark = pytest.mark.skipif(not decoder.available(), reason="needs AVX2 and a C compiler")

# The layers `decoder.Stack` runs, as `LlamaConfig` switches: Llama's, Qwen2's (q/k/v biases),
# Qwen3's (q and k normalized per head) and Gemma 3's (q/k norms, post-norms, GeGLU, a query scale,
# a sliding layer with its own rope base beside a global one).
ARCHITECTURES = {
    "llama": {}, "qwen2": {"qkv_bias": True}, "qwen3": {"qk_norm": True},
    "gemma3": {"qk_norm": True, "post_norms": True, "hidden_act": "gelu_pytorch_tanh",
               "query_pre_attn_scalar": 24, "sliding_window": 3, "sliding_layers": (0,),
               "rope_local_theta": 100.0, "scale_embeddings": True},
}
SPECS = ["fp32", "int4-g32-rtn-head8"]
PROMPT, CHAIN = torch.tensor([3, 1, 4, 1, 5, 9]), torch.tensor([2, 6, 5, 3, 5])
# the root, then 4 nodes
TREE, PARENTS = torch.tensor([4, 8, 9, 7, 9]), torch.tensor([-1, -1, 0, 2])


def arch_model(switches: dict, spec: str = "fp32", hidden: int = 64):
    """A tiny model with these switches at `spec` on the fast path; every norm weight apart from 1
    and from the others (a swapped or skipped norm shows)."""
    model = tiny_model(scale=3.0, hidden=hidden, **switches)
    with torch.no_grad():
        for name, p in model.net.named_parameters():
            if "norm" in name:
                p.normal_(1.0, 0.3)
    quantize_model(model.net, spec, progress=False)
    return backends.runner(model.net, "kernels")


def passes(net) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """A prefill, a chain verify pass, a step and a tree pass (their logits), and
    the cache after them."""
    cache = net.new_cache(32)
    out = [net(PROMPT, cache), net(CHAIN, cache), net(CHAIN[:1], cache)]
    out.append(net(TREE, cache, **verify_layout(PARENTS, cache.length)))
    return out, cache.k[:, :, :, :cache.length].clone(), cache.v[:, :, :, :cache.length].clone()


def assert_near(x: torch.Tensor, y: torch.Tensor, spec: str) -> None:
    """fp32: within float tolerance. Integer weights: int8dot quantizes each activation row, and a
    rounding apart before it may move an activation by a code step, so the error is judged as a
    whole (relative RMS)."""
    if spec == "fp32":
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-4)
    else:
        assert (x - y).pow(2).mean().sqrt() <= 1e-2 * y.pow(2).mean().sqrt()


def assert_passes_near(a: tuple, b: tuple, spec: str = "fp32") -> None:
    (la, ka, va), (lb, kb, vb) = a, b
    for x, y in zip([*la, ka, va], [*lb, kb, vb]):
        assert_near(x, y, spec)


# head_dim 18, hidden 72: partial vectors
CASES = [pytest.param(arch, spec, 64, id=f"{arch}-{spec}") for arch in ARCHITECTURES
         for spec in SPECS] + [
    pytest.param("gemma3", "fp32", 72, id="gemma3-fp32-vector-tails")]


@pytest.mark.parametrize("arch, spec, hidden", CASES)
@torch.inference_mode()
def test_the_layer_stack_computes_what_the_modules_compute(arch, spec, hidden, kernel_variant):
    """Where every linear layer runs on f32dot or int8dot, each cached pass (a chain verify, a step,
    a tree) goes through all layers in one C call and gives the torch modules' logits and cache
    within float tolerance; the stack holds the runner's kernels' weights and the modules' own
    norms and biases."""
    stacked = arch_model(ARCHITECTURES[arch], spec, hidden)
    assert stacked.stack is not None and stacked.stack.variant == kernel_variant
    net = stacked.net
    attention, block, layer = net.layers[0].attention, net.layers[0], stacked.stack.layers[0]
    kernel = stacked.kernels[attention.wqkv]
    assert layer.wqkv is (kernel.panels if spec == "fp32" else kernel.weight)
    assert (layer.qkv_bias is attention.qkv_bias
            and (layer.qkv_bias is not None) == (arch == "qwen2"))
    for name, module in [("q_norm", attention.q_norm), ("k_norm", attention.k_norm),
                         ("post_attention_norm", block.post_attention_norm),
                         ("post_ffn_norm", block.post_ffn_norm)]:
        assert getattr(layer, name) is (None if module is None else module.weight), name
    modules = without_stack(stacked)
    stacked, calls = counting_stack(stacked)
    assert_passes_near(passes(stacked), passes(modules), spec)
    assert calls == [1, 1, 1]  # every cached pass but the prefill


# One feature each, on Llama's layer: its switches, and how to take it off a model's modules.
FEATURES = {
    "sliding window": ({"sliding_window": 3, "sliding_layers": (0, 1)},
                       lambda b: setattr(b.attention, "window", None)),
    "GeGLU": ({"hidden_act": "gelu_pytorch_tanh"},
              lambda b: setattr(b.feed_forward, "act", "silu")),
    "post-norms": ({"post_norms": True}, lambda b: setattr(b, "post_attention_norm", None)
                   or setattr(
        b, "post_ffn_norm", None)),
    "query scale": ({"query_pre_attn_scalar": 4}, lambda b: setattr(b.attention, "scale", None)),
    "local rope": ({"sliding_window": 100, "sliding_layers": (1,), "rope_local_theta": 100.0},
                   lambda b: setattr(b, "local_rope", False)),
}


@pytest.mark.parametrize("feature", FEATURES)
@torch.inference_mode()
def test_the_stack_honours_each_feature_as_the_modules_do(feature, kernel_variant):
    """The stack with one feature gives the torch modules' results with it, which are far from the
    same modules without it (so the feature really ran in C, through steps, a chain and a tree
    whose rows reach past the window)."""
    switches, take_off = FEATURES[feature]
    stacked = arch_model(switches)
    modules = without_stack(stacked)
    plain = without_stack(backends.runner(copy.deepcopy(stacked.net), "kernels"))
    for block in plain.net.layers:
        take_off(block)
    want = passes(modules)
    assert_passes_near(passes(stacked), want)
    with pytest.raises(AssertionError):
        assert_passes_near(passes(plain), want)


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("spec", SPECS)
@torch.inference_mode()
def test_verify_rows_equal_one_token_steps_on_every_variant(spec, arch, kernel_variant):
    """On the stack, each row of a chain verify pass equals its one-token step bit for bit on every
    variant, through all of f32dot's row tiles (up to 4 rows on AVX2, 8 on AVX-512), and each node
    of a tree equals the step at the end of its own path (on a sliding layer, its path's window)."""
    net = arch_model(ARCHITECTURES[arch], spec)
    assert net.stack is not None and net.stack.variant == kernel_variant
    rows = torch.randint(0, 32, (17,), generator=torch.Generator().manual_seed(4))
    cache = net.new_cache(64)
    net(PROMPT, cache)
    steps = torch.cat([net(rows[i:i + 1], cache) for i in range(len(rows))])
    for n in (2, 3, 5, 8, 9, 17):
        cache.crop(len(PROMPT))
        assert torch.equal(net(rows[:n], cache), steps[:n]), n
    cache.crop(len(PROMPT))
    tree = net(TREE, cache, **verify_layout(PARENTS, cache.length))
    for node, path in enumerate([[0], [1], [0, 2], [0, 2, 3]]):
        cache.crop(len(PROMPT))
        step = [net(TREE[:1], cache)] + [net(TREE[1 + i:2 + i], cache) for i in path]
        assert torch.equal(tree[node + 1], step[-1][0]), node


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@torch.inference_mode()
def test_full_blocks_of_keys_at_common_head_sizes(head_dim, kernel_variant):
    """At the head sizes whose blocks of consecutive keys the scores address from one pointer, a
    context of several full blocks: the stack's steps and chain give the modules' logits within
    tolerance, and each chain row its step's bits (the full blocks and the
    partial last one meet)."""
    net = arch_model(ARCHITECTURES["llama"], hidden=4 * head_dim)
    assert net.config.head_dim == head_dim and net.stack.variant == kernel_variant
    modules = without_stack(net)
    prompt = torch.arange(37) % 32
    rows = torch.randint(0, 32, (9,), generator=torch.Generator().manual_seed(5))
    cache, twin = net.new_cache(64), modules.new_cache(64)
    net(prompt, cache)
    modules(prompt, twin)
    steps = torch.cat([net(rows[i:i + 1], cache) for i in range(len(rows))])
    want = modules(rows, twin)
    torch.testing.assert_close(steps, want, rtol=1e-4, atol=1e-4)
    cache.crop(len(prompt))
    assert torch.equal(net(rows, cache), steps)


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("spec", SPECS)
@torch.inference_mode()
def test_a_stacked_pass_of_several_sequences_runs_on_the_stack(spec, arch, kernel_variant):
    """The server's batched verify pass (`forward_many`: a step, a chain and a tree of three
    sequences, each at the end of its own cache) runs in one C call, and each sequence's logits,
    hidden states and cache are its own pass's bit for bit (and the modules' within tolerance);
    sequences of up to ROW_BY_ROW_MAX rows each stay on the stack together beyond that many rows
    in all, as far as the linear layers keep rows invariant."""
    stacked = arch_model(ARCHITECTURES[arch], spec)
    alone, modules = (type(stacked)(stacked.net, "kernels", stacked.kernels, stacked.stack),
                      without_stack(stacked))
    stacked, calls = counting_stack(stacked)
    prompts = [torch.tensor([3, 1, 4, 1, 5]), torch.tensor([9, 2, 6]),
               torch.tensor([5, 3, 5, 8, 9, 7, 9])]
    results = []
    for net, together in ((stacked, True), (alone, False), (modules, True)):
        caches = [net.new_cache(96) for _ in prompts]
        for prompt, cache in zip(prompts, caches):
            net(prompt, cache)
        rows = [[Rows(torch.tensor([2]), caches[0]), Rows(torch.tensor([6, 5, 3]), caches[1]),
                 Rows(TREE, caches[2], **verify_layout(PARENTS, caches[2].length))],
                [Rows(torch.arange(40) % 32, cache) for cache in caches[:2]]]  # 80 rows in all
        out = [r for group in rows
               for r in (net.forward_many(group, return_hidden=True) if together else
                         [net.forward_many([s], return_hidden=True)[0] for s in group])]
        results.append(([t for pair in out for t in pair],
                        [(c.k[:, :, :, :c.length].clone(), c.v[:, :, :, :c.length].clone())
                         for c in caches]))
    (a, ca), (b, cb), (c, cc) = results
    # int8dot keeps rows invariant far beyond 80, so the two 40-row sequences share one call; fp32
    # stacks at most ROW_BY_ROW_MAX rows (torch's GEMM beyond), so they take a call each
    assert calls == [3] + ([2] if stacked.stack_limit() >= 80 else [1, 1]) and 80 > ROW_BY_ROW_MAX
    assert (stacked.stack_limit() >= 80) == (spec != "fp32")
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert all(torch.equal(x, y) for pair_a, pair_b in zip(ca, cb) for x, y in zip(pair_a, pair_b))
    for x, y in zip([*a, *(t for pair in ca for t in pair)],
                    [*c, *(t for pair in cc for t in pair)]):
        assert_near(x, y, spec)


@torch.inference_mode()
def test_a_prefill_and_stack_passes_never_share_a_pass():
    """The modules round differently from the stack, so `forward_many` keeps a prefill (the
    modules' pass) apart from rows the stack takes: each sequence gets its own pass's bits."""
    net, calls = counting_stack(arch_model(ARCHITECTURES["gemma3"]))
    warm = net.new_cache(32)
    net(PROMPT, warm)
    seqs = [Rows(CHAIN, warm), Rows(PROMPT, net.new_cache(32)),
            Rows(CHAIN[:1], copy.deepcopy(warm))]
    alone = [net(s.ids, copy.deepcopy(s.cache)) for s in seqs]
    calls.clear()
    together = net.forward_many(seqs)
    assert calls == [1, 1]  # the first and the last sequence, each beside a prefill
    assert all(torch.equal(logits, want) for (logits, _), want in zip(together, alone))


def test_a_runner_has_a_stack_where_the_kernels_build(force_kernels):
    net = tiny_model(scale=3.0, hidden=64).net
    assert backends.runner(net, "kernels").stack is not None
    force_kernels("torch")  # as on a CPU without AVX2, or without a compiler: torch's ops
    assert backends.runner(net, "kernels").stack is None


def test_gradients_take_the_modules():
    """Where gradients are recorded, a cached pass the stack would take runs the modules (the
    stack's outputs have none), with the modules' results."""
    net = arch_model(ARCHITECTURES["gemma3"])
    modules = without_stack(net)
    net, calls = counting_stack(net)
    cache, twin = net.new_cache(32), modules.new_cache(32)
    with torch.no_grad():
        net(PROMPT, cache)
        modules(PROMPT, twin)
        want = modules(CHAIN, twin, return_hidden=True)
    got = net(CHAIN, cache, return_hidden=True)
    assert not calls and got[1].requires_grad
    assert torch.equal(got[0], want[0]) and torch.equal(got[1].detach(), want[1])


def test_no_stack_where_a_layer_stays_on_torch():
    """bf16 layers (f32dot is float32 only) keep torch's kernels, so the modules run one by one."""
    net = tiny_model(scale=3.0, hidden=64).net.to(torch.bfloat16)
    assert backends.runner(net, "kernels").stack is None


def test_a_stack_refuses_float_panels_of_another_variant(force_kernels):
    """Float panels have the layout of the variant they were made on (8 or 16 outputs each): a
    stack made on another variant would read them wrongly, so it refuses them."""
    wide = [name for name in build.runnable() if name.startswith("avx512")]
    if not wide:
        pytest.skip("this CPU runs no AVX-512 variant")
    force_kernels("avx2")
    net = tiny_model(scale=3.0, hidden=64).net
    run = backends.runner(net, "kernels")
    assert run.stack.variant == "avx2"
    force_kernels(wide[-1])
    with pytest.raises(ValueError,
                       match=f"float panels laid out for the avx2 kernels, not {wide[-1]}"):
        fastpath.layer_stack(net, run.kernels)
