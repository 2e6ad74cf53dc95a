"""Hierarchical drafting: each level verifies the levels below; the output stays the target's."""

import pytest

from specq import generate
from specq.drafters import HierarchicalDrafter, TreeShape
from specq.loading.kinds import for_levels

from conftest import (
    _config,
    _exact_sequence_distribution,
    _feature_model,
    _self_draft,
    chi_square_p,
    perturbed,
    tiny_model,
)


def _levels(target, kind: str) -> list:
    """Cheapest first: a poor draft, then drafts ever closer to the target."""
    if kind == "feature+self":
        return [_feature_model(target), _self_draft(target)]
    if kind == "seq+seq":
        return [perturbed(target, 0.6, seed=2), perturbed(target, 0.1, seed=3)]
    return [_feature_model(target), perturbed(target, 0.4, seed=2), perturbed(target, 0.1, seed=3)]


@pytest.mark.parametrize("kind", ["feature+self", "seq+seq", "three levels"])
@pytest.mark.parametrize("tree", [None, TreeShape(8, 3, 2)], ids=["chain", "tree8"])
def test_greedy_hierarchy_equals_the_target(kind, tree):
    target = tiny_model(vocab=32, scale=3.0, seed=4)
    levels = _levels(target, kind)
    rejected_by_middle = rejected_by_target = 0
    for prompt in ([1, 2, 3], [5, 6, 7, 8, 9]):
        base = generate(target, prompt, None, max_new_tokens=40)
        drafter = for_levels(levels, target, 0.0, tree)
        spec = generate(target, prompt, levels, drafter=drafter, gamma=3, max_new_tokens=40,
                        tree=tree)
        assert spec.token_ids == base.token_ids
        assert isinstance(drafter, HierarchicalDrafter)
        rejected_by_middle += drafter.checked - drafter.passed
        rejected_by_target += spec.stats.drafted - spec.stats.accepted
        assert spec.stats.accepted > 0
    assert rejected_by_middle > 0 and rejected_by_target > 0  # both levels rejected something


@pytest.mark.parametrize("kind", ["seq+seq", "three levels"])
def test_hierarchical_sampling_follows_the_target(kind):
    prompt = [1, 2]
    target = tiny_model(vocab=5, hidden=16, scale=1.0, seed=11)
    levels = ([tiny_model(vocab=5, hidden=16, scale=1.5, seed=12), perturbed(target, 0.3, seed=3)]
              if kind == "seq+seq" else
              [tiny_model(vocab=5, hidden=16, scale=1.5, seed=12), perturbed(target, 0.5, seed=2),
               perturbed(target, 0.2, seed=3)])
    exact = _exact_sequence_distribution(target, prompt, 3, _config())
    runs, counts, middle_rejections, target_rejections = 2000, dict.fromkeys(exact, 0), 0, 0
    for seed in range(runs):
        drafter = for_levels(levels, target, 0.0)
        out = generate(target, prompt, levels, drafter=drafter, gamma=2, max_new_tokens=3,
                       temperature=1.0, seed=seed)
        counts[tuple(out.token_ids)] += 1
        middle_rejections += drafter.checked - drafter.passed
        target_rejections += out.stats.drafted - out.stats.accepted
    assert middle_rejections > 0 and target_rejections > 0
    assert chi_square_p(counts, exact, runs) > 0.001
