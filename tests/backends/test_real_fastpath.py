"""The fast path on the real built-in target: verify rows against one-token steps, and lossless
speculative decoding (chains at gamma 1-8, token trees of 4-64 nodes) for the fp32 target, an int4
target with an int8 head, and the GGUF file at its own precision (Q4_1 blocks
on the int4 kernel)."""

from __future__ import annotations

import pytest
import torch

import specq
from specq.drafters import TreeShape

from conftest import verify_vs_steps

SPECS = ["fp32", "int4-g64-rtn-head8", "gguf"]


@pytest.fixture(scope="module", params=SPECS)
def target(request):
    return specq.load(f"smollm2-135m@{request.param}")


@pytest.fixture(scope="module")
def feature_draft():
    return specq.load("smollm2-135m-feature-draft")


def test_verify_rows_are_one_token_steps(target, capsys):
    ids = torch.tensor(
        target.tokenizer("The quick brown fox jumps over the lazy dog, and then it")["input_ids"])
    worst = max(verify_vs_steps(target.runner, ids[:-8], ids[-n:]) for n in (2, 3, 5, 8))
    with capsys.disabled():
        print(f"\n{target.ref}: largest verify-vs-step logit difference {worst:.2e}")
    assert worst == 0  # every matmul on the fast path is row-invariant


@pytest.mark.parametrize("gamma", [1, 2, 4, 8])
def test_greedy_speculative_equals_target(target, feature_draft, gamma):
    prompt = "Give me three tips for learning a new language."
    base = specq.generate(target, prompt, None, max_new_tokens=48, chat=True)
    spec = specq.generate(target, prompt, feature_draft, gamma=gamma, max_new_tokens=48, chat=True,
                          draft_confidence=0.0)
    assert spec.token_ids == base.token_ids
    assert 0 < spec.stats.accepted < spec.stats.drafted  # accept and reject paths both ran


@pytest.mark.parametrize("shape", [TreeShape(4, 2, 2), TreeShape(16, 4, 4), TreeShape(64, 6, 8)],
                         ids=lambda s: f"{s.size}-nodes")
def test_greedy_trees_equal_target(target, feature_draft, shape):
    """Token trees of 4-64 nodes from the feature draft, on every precision: the
    target's own output."""
    prompt = "Give me three tips for learning a new language."
    base = specq.generate(target, prompt, None, max_new_tokens=32, chat=True)
    spec = specq.generate(target, prompt, feature_draft, tree=shape, max_new_tokens=32, chat=True)
    assert spec.token_ids == base.token_ids
    assert 0 < spec.stats.accepted < spec.stats.drafted
    assert sum(spec.stats.accepted_at[1:]) > 0  # paths past the first level were accepted


def test_greedy_tree_from_the_sequence_draft_equals_target():
    target = specq.load("smollm2-135m@int4-g64-rtn-head8")
    prompt = "Give me three tips for learning a new language."
    base = specq.generate(target, prompt, None, max_new_tokens=32, chat=True)
    spec = specq.generate(target, prompt, specq.load("smollm2-135m-draft"),
                          tree=TreeShape(16, 4, 4), max_new_tokens=32, chat=True)
    assert spec.token_ids == base.token_ids
    assert 0 < spec.stats.accepted < spec.stats.drafted
