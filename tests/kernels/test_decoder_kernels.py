"""kernels/decoder: the fast path's C loops between the linear layers (norms, attention rows,
activations) against torch's ops on every kernel variant this CPU runs, the switch, and rows that
do not depend on their neighbours."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from specq.backends import fastpath
from specq.core.acceptance import verify_layout
from specq.kernels import build, decoder
from specq.model.llama import Attention, FeedForward, RMSNorm, rotate_half
from specq.weights.quant import quantize_model

from conftest import tiny_model

pytestmark = pytest.mark.skipif(not decoder.available(), reason="needs AVX2 and a C compiler")


def test_rms_norm_and_silu_mul_match_torch(kernel_variant):
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(5, 576, generator=g) * 3, torch.randn(576, generator=g)
    torch.testing.assert_close(decoder.rms_norm(x, w, 1e-5), F.rms_norm(x, (576,), w, 1e-5), rtol=1e-5, atol=1e-5)
    gate_up = torch.randn(3, 2 * 100, generator=g) * 4
    gate, up = gate_up.split(100, dim=-1)
    torch.testing.assert_close(decoder.silu_mul(gate_up), F.silu(gate) * up, rtol=1e-5, atol=1e-5)


def reference_attention(qkv, heads, kv_heads, cos, sin, k_cache, v_cache, start, seen):
    """What the kernel computes, in torch: rotate, write the rows' keys and values at `start`,
    then each row attends to its seen slots (causal when `seen` is None)."""
    n, dim = qkv.shape[0], cos.shape[-1]
    q, k, v = qkv.view(n, heads + 2 * kv_heads, dim).split([heads, kv_heads, kv_heads], dim=1)
    q, k = (t * cos[:, None] + rotate_half(t) * sin[:, None] for t in (q, k))
    k_cache[:, start:start + n], v_cache[:, start:start + n] = k.transpose(0, 1), v.transpose(0, 1)
    out = []
    for i in range(n):
        slots = torch.arange(start + i + 1) if seen is None else seen[i]
        keys = k_cache[:, slots].repeat_interleave(heads // kv_heads, dim=0)
        values = v_cache[:, slots].repeat_interleave(heads // kv_heads, dim=0)
        weights = torch.softmax((q[i][:, None] @ keys.transpose(1, 2)) * dim ** -0.5, dim=-1)
        out.append((weights @ values).reshape(-1))
    return torch.stack(out)


@pytest.mark.parametrize("dim", [16, 90])  # 90: whole vectors and a tail, in the dot products and the weighted sum
@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_attend_rows_matches_torch(tree, dim, kernel_variant):
    g = torch.Generator().manual_seed(1)
    heads, kv_heads, capacity, start, n = 6, 2, 40, 11, 4
    qkv = torch.randn(n, (heads + 2 * kv_heads) * dim, generator=g)
    angles = torch.randn(n, dim // 2, generator=g).repeat(1, 2)
    cos, sin = angles.cos(), angles.sin()
    k_cache, v_cache = torch.randn(2, kv_heads, capacity, dim, generator=g)
    seen = None
    if tree:  # rows 0 and 1 are children of the root, 2 a child of 0, 3 a child of 2
        prefix = list(range(start))
        seen = [torch.tensor(prefix + p) for p in ([start], [start + 1], [start, start + 2],
                                                    [start, start + 2, start + 3])]
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    expected = reference_attention(qkv, heads, kv_heads, cos, sin, expected_k, expected_v, start, seen)
    out = decoder.attend_rows(qkv, heads, kv_heads, cos, sin, k_cache, v_cache, start, seen)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    # the rotation rounds as torch's does: the cache rows are the same bits
    assert torch.equal(k_cache, expected_k) and torch.equal(v_cache, expected_v)


def test_a_row_does_not_depend_on_the_rows_beside_it(kernel_variant):
    """Row i of a pass equals row i computed alone with the same keys in the cache, bit for bit."""
    g = torch.Generator().manual_seed(2)
    heads, kv_heads, dim, capacity, start, n = 9, 3, 64, 64, 20, 9
    qkv = torch.randn(n, (heads + 2 * kv_heads) * dim, generator=g)
    angles = torch.randn(n, dim // 2, generator=g).repeat(1, 2)
    cos, sin = angles.cos(), angles.sin()
    caches = torch.randn(2, kv_heads, capacity, dim, generator=g)
    together = decoder.attend_rows(qkv, heads, kv_heads, cos, sin, *caches.clone(), start, None)
    k_cache, v_cache = caches.clone()
    for i in range(n):  # one row at a time, each after the ones before it, as steps run
        alone = decoder.attend_rows(qkv[i:i + 1].contiguous(), heads, kv_heads, cos[i:i + 1].contiguous(),
                                    sin[i:i + 1].contiguous(), k_cache, v_cache, start + i, None)
        assert torch.equal(alone[0], together[i]), i


def test_apply_switches_the_decoder_and_revert_switches_back(force_kernels):
    model = tiny_model(scale=3.0, hidden=64)
    eager = model.net
    fast = copy.deepcopy(eager)
    fastpath.apply(fast)
    glue = [m for m in fast.modules() if isinstance(m, (RMSNorm, Attention, FeedForward))]
    assert len(glue) == 2 * 4 + 1 and all(m.kernel for m in glue)  # 2 norms, attention, ffn per layer; the last norm
    ids = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6, 5, 3])
    with torch.inference_mode():
        logits = {}
        for name, net in (("eager", eager), ("fast", fast)):
            cache = net.new_cache(32)
            net(ids[:6], cache)  # a prefill: fused attention in both
            logits[name] = torch.cat([net(ids[6:8], cache), net(ids[8:9], cache), net(ids[9:], cache)])
    torch.testing.assert_close(logits["fast"], logits["eager"], rtol=1e-4, atol=1e-4)
    fastpath.revert(fast)
    assert not any(m.kernel for m in glue)
    force_kernels("torch")  # as on a CPU without AVX2, or without a compiler: torch's ops
    fastpath.apply(fast)
    assert not any(m.kernel for m in glue) and fast.stack is None


def test_training_keeps_torch_ops():
    """A module left on the fast path still trains: the kernels step aside where gradients flow."""
    model = tiny_model(scale=3.0, hidden=64)
    fastpath.apply(model.net)
    norm = model.net.layers[0].attention_norm
    x = torch.randn(2, 3, 64)
    norm(x).sum().backward()
    assert norm.weight.grad is not None and norm.weight.grad.abs().sum() > 0


# The layers `decoder.Stack` runs: Llama's, Qwen2's (q/k/v biases) and Qwen3's (q and k normalized per head).
ARCHITECTURES = {"llama": {}, "qwen2": {"qkv_bias": True}, "qwen3": {"qk_norm": True}}


def arch_model(arch: str):
    """A tiny model of `arch`, its q and k norm weights apart from 1 and from each other (a swap shows)."""
    model = tiny_model(scale=3.0, hidden=64, **ARCHITECTURES[arch])
    with torch.no_grad():
        for name, p in model.net.named_parameters():
            if "q_norm" in name or "k_norm" in name:
                p.normal_(1.0, 0.3)
    return model


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("spec", ["fp32", "int4-g32-rtn-head8"])
@torch.inference_mode()
def test_the_layer_stack_computes_what_the_modules_compute(spec, arch, kernel_variant):
    """Where every linear layer runs on f32dot or int8dot, a one-sequence pass goes through all
    layers in one C call (`decoder.Stack`), q/k/v biases and q/k norms included; steps, a chain
    verify pass and a tree pass give the modules' logits and cache bit for bit, and a copied model
    gets a stack of its own copied weights."""
    model = arch_model(arch)
    quantize_model(model.net, spec, progress=False)
    fastpath.apply(model.net)
    stacked = model.net
    assert stacked.stack is not None
    modules = copy.deepcopy(stacked)
    attention, layer = modules.layers[0].attention, modules.stack.layers[0]
    assert layer.wqkv is (attention.wqkv.float_panels() if spec == "fp32" else attention.wqkv._int8dot)
    assert layer.qkv_bias is attention.qkv_bias and (layer.qkv_bias is not None) == (arch == "qwen2")
    if arch == "qwen3":
        assert layer.q_norm is attention.q_norm.weight and layer.k_norm is attention.k_norm.weight
    else:
        assert layer.q_norm is None and layer.k_norm is None
    modules.stack = None
    prompt, chain = torch.tensor([3, 1, 4, 1, 5, 9]), torch.tensor([2, 6, 5, 3, 5])
    tree, parents = torch.tensor([4, 8, 9, 7, 9]), torch.tensor([-1, -1, 0, 2])  # the root, then 4 nodes
    results = []
    for net in (stacked, modules):
        cache = net.new_cache(32)
        out = [net(prompt, cache), net(chain, cache), net(chain[:1], cache)]
        out.append(net(tree, cache, **verify_layout(parents, cache.length)))
        results.append((out, cache.k[:, :, :, :cache.length].clone(), cache.v[:, :, :, :cache.length].clone()))
    (a, ka, va), (b, kb, vb) = results
    assert all(torch.equal(x, y) for x, y in zip(a, b)) and torch.equal(ka, kb) and torch.equal(va, vb)
    fastpath.revert(stacked)
    assert stacked.stack is None


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("spec", ["fp32", "int4-g32-rtn-head8"])
@torch.inference_mode()
def test_a_stacked_pass_of_several_sequences_runs_on_the_stack(spec, arch, kernel_variant):
    """The server's batched verify pass (`forward_many`: a step, a chain and a tree of three
    sequences, each at the end of its own cache) runs in one C call, and each sequence's logits,
    hidden states and cache are the modules' bit for bit; passes beyond ROW_BY_ROW_MAX rows in all
    take the modules."""
    from specq.model.llama import ROW_BY_ROW_MAX, Rows

    model = arch_model(arch)
    quantize_model(model.net, spec, progress=False)
    fastpath.apply(model.net)
    stacked = model.net
    modules = copy.deepcopy(stacked)
    modules.stack = None
    calls = []
    stack = stacked.stack
    stacked.stack = lambda x, cos, sin, segments: calls.append(len(segments)) or stack(x, cos, sin, segments)
    prompts = [torch.tensor([3, 1, 4, 1, 5]), torch.tensor([9, 2, 6]), torch.tensor([5, 3, 5, 8, 9, 7, 9])]
    tree, parents = torch.tensor([4, 8, 9, 7, 9]), torch.tensor([-1, -1, 0, 2])
    results = []
    for net in (stacked, modules):
        caches = [net.new_cache(96) for _ in prompts]
        for prompt, cache in zip(prompts, caches):
            net(prompt, cache)
        rows = [Rows(torch.tensor([2]), caches[0]), Rows(torch.tensor([6, 5, 3]), caches[1]),
                Rows(tree, caches[2], **verify_layout(parents, caches[2].length))]
        out = net.forward_many(rows, return_hidden=True)
        long = [Rows(torch.arange(40) % 32, cache) for cache in caches[:2]]  # 80 rows: past the stack's limit
        out += net.forward_many(long, return_hidden=True)
        results.append(([t for pair in out for t in pair],
                        [(c.k[:, :, :, :c.length].clone(), c.v[:, :, :, :c.length].clone()) for c in caches]))
    # the three sequences' pass in one call; 80 rows stacked (int8dot keeps rows invariant that far)
    # take the modules, while fp32 passes stack at most 65 rows, so its 40 + 40 run as two passes
    assert calls == [3] + ([] if stacked.stack_limit() >= 80 else [1, 1]) and 80 > ROW_BY_ROW_MAX
    assert (stacked.stack_limit() >= 80) == (spec != "fp32")
    (a, ca), (b, cb) = results
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert all(torch.equal(x, y) for pair_a, pair_b in zip(ca, cb) for x, y in zip(pair_a, pair_b))


def test_no_stack_where_a_layer_stays_on_torch():
    """bf16 layers (f32dot is float32 only) keep torch's kernels, so the modules run one by one."""
    net = tiny_model(scale=3.0, hidden=64).net.to(torch.bfloat16)
    fastpath.apply(net)
    assert net.stack is None


def test_a_stack_refuses_float_panels_of_another_variant(force_kernels):
    """Float panels have the layout of the variant they were made on (8 or 16 outputs each): a
    stack made on another variant would read them wrongly, so it refuses them."""
    wide = [name for name in build.runnable() if name.startswith("avx512")]
    if not wide:
        pytest.skip("this CPU runs no AVX-512 variant")
    force_kernels("avx2")
    net = tiny_model(scale=3.0, hidden=64).net
    fastpath.apply(net)
    assert net.stack.variant == "avx2"
    force_kernels(wide[-1])
    with pytest.raises(ValueError, match=f"float panels laid out for the avx2 kernels, not {wide[-1]}"):
        fastpath.layer_stack(net)


@pytest.mark.parametrize("spec", ["fp32", "int4-g32-rtn-head8"])
@torch.inference_mode()
def test_verify_rows_equal_one_token_steps_on_every_variant(spec, kernel_variant):
    """On the fast path, each row of a verify pass equals its one-token step bit for bit on every
    variant, through all of f32dot's row tiles (up to 4 rows on AVX2, 8 on AVX-512)."""
    model = tiny_model(scale=3.0, hidden=64)
    quantize_model(model.net, spec, progress=False)
    fastpath.apply(model.net)
    net = model.net
    assert net.stack is not None and net.stack.variant == kernel_variant
    prompt = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6])
    rows = torch.randint(0, 32, (17,), generator=torch.Generator().manual_seed(4))
    cache = net.new_cache(64)
    net(prompt, cache)
    steps = torch.cat([net(rows[i:i + 1], cache) for i in range(len(rows))])
    for n in (2, 3, 5, 8, 9, 17):
        cache.crop(len(prompt))
        assert torch.equal(net(rows[:n], cache), steps[:n]), n
