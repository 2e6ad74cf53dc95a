"""Batching: sequences that share a target pass (`Llama.forward_many`, `decode.step`) get exactly
what each gets alone, bit for bit, on the fast path at fp32 and int4."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from specq import api, generate
from specq.core.acceptance import verify_layout
from specq.core.decode import Sequence, step
from specq.core.gamma import GammaMemory
from specq.drafters import TreeShape
from specq.kernels import f32dot
from specq.kernels.rows import ROW_BY_ROW_MAX
from specq.model.llama import MAX_STACKED_ROWS, Rows, invariant_rows

from conftest import _feature_model, at, perturbed, tiny_model

# oneDNN's packed GEMM; int4 kernel + fp32 / int8 head
FAST = ["fp32", "int4-g32-rtn", "int4-g32-rtn-head8"]


def prefilled(net, prompt: list[int], capacity: int = 400):
    cache = net.new_cache(capacity)
    net(torch.tensor(prompt), cache)
    return cache


def passes(net, rng: torch.Generator) -> list[Rows]:
    """Sequences at different lengths with every kind of pass: a plain step, chain verifies of 3
    and 17 rows, a tree verify, a prefill (fused attention) and a 100-row pass."""
    def tokens(n: int) -> torch.Tensor:
        return torch.randint(0, 32, (n,), generator=rng)

    parents = torch.tensor([-1, -1, 0, 0, 1, 2, -1])
    tree_cache = prefilled(net, tokens(9).tolist())
    return [Rows(tokens(1), prefilled(net, tokens(5).tolist())),
            Rows(tokens(3), prefilled(net, tokens(12).tolist())),
            Rows(tokens(8), tree_cache, **verify_layout(parents, tree_cache.length)),
            Rows(tokens(6), net.new_cache(400), last_only=True),
            Rows(tokens(17), prefilled(net, tokens(30).tolist())),
            Rows(tokens(100), prefilled(net, tokens(3).tolist()))]


def assert_same_as_alone(net, seqs: list[Rows]) -> None:
    """forward_many over `seqs` equals each sequence's own forward: logits, hidden states, cache."""
    alone = []
    for s in seqs:
        cache = copy.deepcopy(s.cache)
        logits, hidden = net(s.ids, cache, s.last_only, True, s.positions, s.mask)
        alone.append((logits, hidden, cache))
    together = net.forward_many(seqs, return_hidden=True)
    for i, (s, (logits, hidden),
            (want_logits, want_hidden, cache)) in enumerate(zip(seqs, together, alone)):
        assert torch.equal(logits, want_logits), i
        assert torch.equal(hidden, want_hidden), i
        assert s.cache.length == cache.length
        assert torch.equal(s.cache.k[:, :, :, :cache.length], cache.k[:, :, :, :cache.length]), i


@pytest.mark.parametrize("spec", FAST)
@torch.inference_mode()
def test_stacked_rows_equal_each_sequence_alone(spec):
    net = at(tiny_model(scale=3.0, hidden=64), spec, fast=True).runner
    # every kernel row-invariant up to the cap; float layers (fp32, and the fp32 head of
    # int4-g32-rtn) only up to f32dot's rows: beyond them torch's GEMM takes over
    # and rounds differently
    floats = spec != "int4-g32-rtn-head8" and f32dot.available()
    assert net.stack_limit() == (ROW_BY_ROW_MAX if floats else MAX_STACKED_ROWS)
    rng = torch.Generator().manual_seed(0)
    assert_same_as_alone(net, passes(net, rng))
    # the cap full: 16 sequences of 16 rows, and beyond it (split into several passes)
    many = [Rows(torch.randint(0, 32, (16,), generator=rng), prefilled(net, [1, 2, 3 + i]))
            for i in range(20)]
    assert_same_as_alone(net, many)


class Neighbourly(nn.Module):
    """A linear layer whose rows depend on the rows beside it from `rows` rows on (as a GEMM that
    changes its blocking and summation order with the row count would)."""

    def __init__(self, linear: nn.Module, rows: int):
        super().__init__()
        self.inner, self.rows = linear, rows
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.inner(x)
        return (y + 1e-3 * y.mean(dim=-2, keepdim=True)
                if x.reshape(-1, self.in_features).shape[0] >= self.rows else y)


@torch.inference_mode()
def test_a_kernel_that_rounds_by_its_neighbours_caps_the_stack():
    """The probe finds the row count where a kernel stops being row-invariant, and forward_many
    stacks no more rows than that: every sequence still gets its own pass's result."""
    net = at(tiny_model(scale=3.0, hidden=64), "fp32", fast=True).runner
    w2 = net.net.layers[1].feed_forward.w2
    # its kernel, rounding by neighbours
    net.kernels[w2] = Neighbourly(net.kernels.get(w2, w2), rows=9)
    assert invariant_rows(net.net, MAX_STACKED_ROWS, net.dtype, net.linear,
                          lambda m: net.kernels.get(m, m)) == 8
    assert net.stack_limit() == 8
    calls = []
    stacked = net.net.stacked
    net.net.stacked = lambda seqs, *rest, **kw: calls.append(sum(s.ids.shape[0]
                                                                 for s in seqs)) or stacked(
        seqs, *rest, **kw)
    seqs = [Rows(torch.tensor([5, 6, 7]), prefilled(net, [1, 2, 3 + i])) for i in range(5)]
    assert_same_as_alone(net, seqs)
    assert calls[-3:] == [6, 6, 3]  # stacks of at most 8 rows


def run_together(target, requests: list[dict], join_every: int = 2,
                 speculate=lambda step: True) -> list[Sequence]:
    """Step the requests' sequences together as the server does: one joins every `join_every`
    steps (prefilled on its own), the finished leave; `speculate(step)`: whether step number
    `step` may draft."""
    sequences = [api.start(target, **r) for r in requests]
    waiting, running, steps = list(sequences), [], 0
    while waiting or running:
        if waiting and (not running or steps % join_every == 0):
            waiting[0].prefill()
            running.append(waiting.pop(0))
        running = [s for s in running if not s.done]
        if running:
            step(running, speculate=speculate(steps))
            steps += 1
    return sequences


@pytest.mark.parametrize("spec", ["fp32", "int4-g32-rtn-head8"])
def test_batched_greedy_decoding_equals_generate(spec):
    """Plain and speculative requests (gammas 1 and 3, auto, a token tree, a feature draft), with
    different prompts and lengths, stepped together: each gets `specq.generate`'s tokens."""
    base = tiny_model(scale=3.0, hidden=64)
    target = at(base, spec, fast=True)
    draft = at(perturbed(base, 0.5), "fp32", fast=True)
    feature = _feature_model(target, vocab_ids=list(range(32)))
    requests = [dict(prompt=[1, 2, 3], max_new_tokens=30),
                dict(prompt=[7, 7, 7, 7, 8], draft=draft, gamma=1, max_new_tokens=25,
                     draft_confidence=0.0),
                dict(prompt=[4, 9], draft=draft, gamma=3, max_new_tokens=40, draft_confidence=0.0),
                dict(prompt=[11, 12, 13, 14, 15, 16], draft=draft, gamma="auto", max_new_tokens=35),
                dict(prompt=[3, 1, 4, 1, 5], draft=draft, tree=TreeShape(8, 3, 2),
                     max_new_tokens=30),
                dict(prompt=[2, 7, 1, 8], draft=feature, gamma=2, max_new_tokens=30),
                dict(prompt=[9], max_new_tokens=1)]
    together = run_together(target, requests)
    rejected = 0
    for request, sequence in zip(requests, together):
        alone = generate(target, **request)
        got = api.finish(sequence, request.get("draft"))
        assert got.token_ids == alone.token_ids, request
        assert got.text == alone.text and got.finish_reason == alone.finish_reason
        rejected += got.stats.drafted - got.stats.accepted
    assert rejected > 0 and sum(s.stats.accepted for s in together) > 0  # both outcomes ran


def test_plain_steps_in_a_batch_keep_every_output():
    """A server under load may make a whole step plain (`step(..., speculate=False)`): nothing is
    drafted in it, gamma auto does not learn from it, and every greedy request still gets exactly
    `specq.generate`'s tokens."""
    base = tiny_model(scale=3.0, hidden=64)
    target = at(base, "fp32", fast=True)
    draft = at(perturbed(base, 0.5), "fp32", fast=True)
    requests = [dict(prompt=[7, 7, 7, 7, 8], draft=draft, gamma=3, max_new_tokens=25,
                     draft_confidence=0.0),
                dict(prompt=[4, 9], draft=draft, gamma="auto", max_new_tokens=40),
                dict(prompt=[3, 1, 4, 1, 5], draft=draft, tree=TreeShape(8, 3, 2),
                     max_new_tokens=30),
                dict(prompt=[2, 7, 1], draft=draft, gamma=2, max_new_tokens=30)]
    drafted = {}
    for name, rule in (("always", lambda n: True), ("every third", lambda n: n % 3 == 0)):
        together = run_together(target, requests, speculate=rule)
        for request, sequence in zip(requests, together):
            assert (api.finish(sequence, draft).token_ids
                    == generate(target, **request).token_ids), (name, request)
        drafted[name] = [s.stats.drafted for s in together]
    fixed = [0, 2, 3]  # gamma auto drafts rarely here either way
    assert all(drafted["every third"][i] < drafted["always"][i] / 2 for i in fixed)
    # a memory of its own: not what a caller kept from earlier runs (this draft rarely pays)
    auto = api.start(target, [4, 9], draft, gamma="auto", max_new_tokens=8,
                     gamma_memory=GammaMemory())
    auto.prefill()
    step([auto], speculate=False)
    # nothing learned
    assert auto.stats.drafted == 0 and auto.stats.steps == 1 and not auto.choosers
    step([auto])
    assert auto.stats.drafted > 0 and list(auto.chooser.recent_caps) == [auto.cap]


def test_batched_sampling_follows_each_requests_seed():
    """Sampled requests keep their own generators: stepped together, each draws exactly what it
    draws alone with its seed (so its distribution is the target's, as alone)."""
    base = tiny_model(scale=1.0, hidden=64)
    target = at(base, "int4-g32-rtn-head8", fast=True)
    draft = at(perturbed(base, 0.3), "fp32", fast=True)
    requests = [dict(prompt=[1, 2, 3], draft=draft, gamma=3, temperature=1.0, seed=s,
                     max_new_tokens=30)
                for s in range(3)]
    requests += [dict(prompt=[5, 6], temperature=0.8, top_p=0.9, seed=7, max_new_tokens=20),
                 dict(prompt=[5, 6], draft=draft, tree=TreeShape(4, 2, 2), temperature=1.0, seed=8,
                      max_new_tokens=20)]
    together = run_together(target, requests, join_every=1)
    outputs = [api.finish(s, r.get("draft")).token_ids for r, s in zip(requests, together)]
    assert outputs == [generate(target, **r).token_ids for r in requests]
    assert len(set(map(tuple, outputs[:3]))) == 3  # the seeds differ, and so do the samples


def test_step_refuses_sequences_of_different_targets():
    a, b = tiny_model(), tiny_model(seed=1)
    sequences = [api.start(a, [1, 2], None, max_new_tokens=3),
                 api.start(b, [1, 2], None, max_new_tokens=3)]
    for s in sequences:
        s.prefill()
    with pytest.raises(ValueError, match="share their target"):
        step(sequences)


def test_linear_kernels_at_the_real_models_shapes_stack_exactly():
    """The built-in target's layer shapes (hidden 576, MLP 1536, vocabulary 49,152) on the fast
    path's kernels, at fp32 and int4 with an int8 head: row-invariant up to the stacking cap (float
    layers up to f32dot's rows, where torch's GEMM takes over)."""
    from specq.backends import fastpath
    from specq.weights.quant import quantize_model

    class Shapes(nn.Module):
        def __init__(self):
            super().__init__()
            sizes = [(576, 960), (576, 576), (576, 3072), (1536, 576)]
            self.layers = nn.ModuleList(nn.Linear(i, o, bias=False) for i, o in sizes)
            self.output = nn.Linear(576, 49152, bias=False)

    for spec in ("fp32", "int4-g64-rtn-head8"):
        torch.manual_seed(0)
        net = Shapes()
        for p in net.parameters():
            nn.init.normal_(p, std=0.05)
        if spec != "fp32":
            quantize_model(net, spec, progress=False)
        table = fastpath.kernels(net)
        cap = ROW_BY_ROW_MAX if spec == "fp32" and f32dot.available() else MAX_STACKED_ROWS
        assert (invariant_rows(net, MAX_STACKED_ROWS, torch.float32, lambda m, x: table[m](x))
                == cap), spec


def test_hidden_states_need_the_native_module():
    """A transformers target takes chains only (no tree rows, no hidden states)."""
    from conftest import tiny_hf_qwen2

    target = tiny_hf_qwen2(0)
    cache = target.net.new_cache(16)
    with pytest.raises(ValueError, match="chains only"):
        target.net.forward_many([Rows(torch.tensor([1, 2]), cache)], return_hidden=True)
