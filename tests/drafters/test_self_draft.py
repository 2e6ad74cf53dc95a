"""Self-speculation: the target's own weights at a lower precision draft for it (`self@SPEC`)."""


import pytest

from specq import generate
from specq.drafters import TreeShape
from specq.loading.refs import model_ref

from conftest import (_config, _exact_sequence_distribution, _self_draft, chi_square_p,
                      sampled_outputs, tiny_model)


def test_self_refs_name_the_target_at_the_spec():
    def resolved(draft: str, target: str) -> str:
        return model_ref(draft).for_target(target).text

    assert resolved("self@int4-g64-gptq", "smollm2-135m@fp32") == "smollm2-135m@int4-g64-gptq"
    assert resolved("self@int8", "./my-model@bf16") == "./my-model@int8"
    assert resolved("smollm2-135m-draft", "smollm2-135m") == "smollm2-135m-draft"


@pytest.mark.parametrize("options", [dict(gamma=1), dict(gamma=4), dict(gamma="auto"),
                                     dict(tree=TreeShape(8, 3, 2))],
                         ids=["gamma1", "gamma4", "auto", "tree8"])
def test_greedy_self_speculation_equals_the_target(options):
    target = tiny_model(vocab=32, scale=3.0, seed=4)
    draft = _self_draft(target)
    rejected = 0
    for prompt in ([1, 2, 3], [5, 6, 7, 8, 9]):
        base = generate(target, prompt, None, max_new_tokens=40)
        spec = generate(target, prompt, draft, max_new_tokens=40, draft_confidence=0.0, **options)
        assert spec.token_ids == base.token_ids
        assert spec.stats.accepted > 0
        rejected += spec.stats.drafted - spec.stats.accepted
    if "tree" in options:
        assert rejected > 0  # a tree's other branches are rejected


def test_self_speculative_sampling_follows_the_target():
    prompt = [1, 2]
    target = tiny_model(vocab=5, hidden=16, scale=1.0, seed=11)
    draft = _self_draft(target)
    exact = _exact_sequence_distribution(target, prompt, 3, _config())
    runs = 2000
    counts, rejected = sampled_outputs(target, draft, prompt, runs)
    assert rejected > 0  # int8 weights move the distribution a little: rejections do happen
    assert chi_square_p(counts, exact, runs) > 0.001


