"""The fast path: packed oneDNN GEMMs for float layers, beside the packed int8/int4 kernels.
Lossless on it (greedy token for token, with rejections), and how far a verify row's logits are
from the same position computed as a one-token step, for each precision and path."""

from __future__ import annotations

import copy

import pytest
import torch

from specq import backends, generate
from specq.backends import fastpath
from specq.drafters import TreeShape

from conftest import _feature_model, at, perturbed, tiny_model, verify_vs_steps

PRECISIONS = ["fp32", "bf16", "int8", "int4-g32-rtn", "int4-g32-rtn-head8"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_linears_compute_the_same_layer(dtype):
    model = tiny_model(hidden=64)
    eager = model.net.to(dtype)
    table = fastpath.kernels(eager)
    if not fastpath.packs(dtype):  # bf16 needs AVX512-BF16 / AVX-NE-CONVERT: left on F.linear
        assert table == {}
        return
    assert len(table) == 2 * 4 + 1  # wqkv, wo, w13, w2 in each of 2 layers, and the head
    assert isinstance(table[eager.output], fastpath.FloatKernel)
    for name in ("layers.0.attention.wqkv", "layers.1.feed_forward.w2", "output"):
        module = eager.get_submodule(name)
        x = torch.randn(5, module.in_features, dtype=dtype)
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(table[module](x), module(x), rtol=tol, atol=tol)
    # the modules themselves stay as they were
    assert all(type(m) is torch.nn.Linear for m in table)


@pytest.mark.parametrize("spec", PRECISIONS)
@pytest.mark.parametrize("gamma", [1, 3, 8])
def test_greedy_equality_on_the_fast_path(spec, gamma):
    base = tiny_model(scale=3.0, hidden=64)
    target = at(base, spec, fast=True)
    draft = at(perturbed(base, 0.5), "fp32", fast=True)
    accepted = rejected = 0
    for prompt in ([1, 2, 3], [7, 7, 7, 7, 8, 9, 10, 11]):
        plain = generate(target, prompt, None, max_new_tokens=40)
        spec_out = generate(target, prompt, draft, gamma=gamma, max_new_tokens=40,
                            draft_confidence=0.0)
        assert spec_out.token_ids == plain.token_ids
        s = spec_out.stats
        accepted += s.accepted
        rejected += s.drafted - s.accepted
    assert accepted > 0 and rejected > 0  # both the accept and the reject path ran


@pytest.mark.parametrize("spec", PRECISIONS)
@pytest.mark.parametrize("shape", [TreeShape(1, 1, 1), TreeShape(8, 3, 2), TreeShape(64, 6, 8)],
                         ids=lambda s: f"{s.size}-nodes")
def test_greedy_trees_on_the_fast_path_at_every_precision(spec, shape):
    """Token trees of 1-64 nodes from a sequence draft and a feature draft, every precision: the
    target's own output (each tree row attends to exactly its own path's keys)."""
    base = tiny_model(scale=3.0, hidden=64)
    target = at(base, spec, fast=True)
    drafts = [at(perturbed(base, 0.5), "fp32", fast=True),
              _feature_model(target, vocab_ids=list(range(32)))]
    for draft in drafts:
        rejected = 0
        for prompt in ([1, 2, 3], [7, 7, 7, 7, 8, 9, 10, 11]):
            plain = generate(target, prompt, None, max_new_tokens=30)
            tree = generate(target, prompt, draft, tree=shape, max_new_tokens=30)
            assert tree.token_ids == plain.token_ids
            rejected += tree.stats.drafted - tree.stats.accepted
        assert rejected > 0 or shape.size == 1


@pytest.mark.parametrize("fast", [False, True], ids=["eager", "fast"])
def test_verify_rows_against_one_token_steps(fast, capsys):
    """Where every matmul is a packed integer kernel (an int8/int4 body with an int8 head) a verify
    row is bit-identical to its one-token step (attention goes row by row). An fp32 GEMM (MKL's or
    oneDNN's) rounds a row differently with other rows beside it, so an fp32 head or body differs
    by float rounding steps. Printed per precision and path."""
    base = tiny_model(scale=3.0, hidden=64)
    prompt, rows = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6]), torch.tensor([5, 3, 5, 8, 9, 7, 9, 3, 2])
    worst = {}
    for spec in PRECISIONS:
        model = at(base, spec, fast)
        worst[spec] = max(verify_vs_steps(model.runner, prompt, rows[:n]) for n in (2, 4, 9))
    with capsys.disabled():
        print(f"\nlargest verify-vs-step logit difference ({'fast' if fast else 'eager'}): "
              + ", ".join(f"{k} {v:.2e}" for k, v in worst.items()))
    assert worst["int4-g32-rtn-head8"] == 0
    assert all(v < 1e-3 for v in worst.values())


def test_the_compiled_backend_stays_lossless():
    """The compiled backend (real inductor, not a stub backend) runs torch's modules, not the fast
    path's, and gives the eager output token for token beside a fast-path draft."""
    model = tiny_model(scale=3.0, hidden=64)
    base = generate(model, [1, 2, 3], None, max_new_tokens=12)
    compiled = copy.copy(model)
    compiled.runner = backends.runner(model.net, "compiled")
    assert (compiled.runner.backend == "compiled" and compiled.runner.kernels == {}
            and compiled.runner.stack is None)
    draft = at(perturbed(tiny_model(scale=3.0, hidden=64), 0.5), "fp32", fast=True)
    out = generate(compiled, [1, 2, 3], draft, gamma=3, max_new_tokens=12, draft_confidence=0.0)
    assert out.token_ids == base.token_ids and out.stats.accepted < out.stats.drafted
    assert compiled.runner.compile_s > 0
