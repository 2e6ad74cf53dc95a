"""The embedded SmolLM2-135M target: lossless speculative decoding on a real model."""

import pytest

import specq
from specq.loading.drafts import registry
from specq.loading.builtins import ASSETS

PROMPTS = [("The capital of France is", False),
           ("Write a short poem about the sea.", True),
           ("What is 17 times 23? Think step by step.", True)]


@pytest.fixture(scope="module", params=["smollm2-135m-draft", "smollm2-135m-feature-draft"])
def draft(request):
    """Each shipped draft: the sequence draft and the feature draft."""
    return specq.load(request.param)


def test_registry_picks_the_shipped_drafts(tmp_path):
    # the package's manifest only, whatever the user has registered
    shipped = [ASSETS / "drafts", tmp_path]
    assert registry.select(*shipped, "smollm2-135m", "fp32")[0].name == "smollm2-135m-feature-draft"
    # nearest
    assert registry.select(*shipped, "smollm2-135m", "int8")[0].name == "smollm2-135m-feature-draft"
    assert (registry.select(*shipped, "smollm2-135m", "fp32", quantizable=True)[0].name
            == "smollm2-135m-draft")
    # int4: the feature draft measured better than the int4-calibrated sequence draft
    # (docs/fastpath.md at 4a89039)
    assert (registry.select(*shipped, "smollm2-135m", "int4-g64-rtn")[0].name
            == "smollm2-135m-feature-draft")
    assert (registry.select(*shipped, "smollm2-135m", "int2-g32-gptq")[0].name
            == "smollm2-135m-feature-draft")
    assert (registry.select(*shipped, "smollm2-135m", "int4-g64-rtn", quantizable=True)[0].name
            == "smollm2-135m-draft-int4-g64-rtn")


def test_shipped_drafts_are_chosen_by_their_builtin_names(tmp_path, monkeypatch):
    """A portable ref: bench cell keys and printed notes do not hold this checkout's path."""
    from specq.loading.drafts.select import select_draft

    monkeypatch.setenv("SPECQ_CACHE", str(tmp_path))  # no user-calibrated drafts
    assert select_draft("smollm2-135m")[0] == "smollm2-135m-feature-draft@int8-head8"
    assert select_draft("smollm2-135m@int4-g64-rtn")[0] == "smollm2-135m-feature-draft@int8-head8"


def test_builtin_target_answers(real_target):
    out = specq.generate(real_target, "The capital of France is", None, max_new_tokens=4)
    assert "Paris" in out.text


@pytest.mark.parametrize("prompt,chat", PROMPTS)
def test_greedy_speculative_equals_target(real_target, draft, prompt, chat):
    base = specq.generate(real_target, prompt, None, max_new_tokens=64, chat=chat)
    for gamma in (1, 2, 4, 8):
        spec = specq.generate(real_target, prompt, draft, gamma=gamma, max_new_tokens=64, chat=chat)
        assert spec.token_ids == base.token_ids, f"gamma={gamma}"
        assert spec.text == base.text


def test_quantized_real_target_stays_lossless(draft):
    target = specq.load("smollm2-135m@int4-g64-rtn")  # packed int4 kernel
    prompt = "Give me three tips for learning a new language."
    base = specq.generate(target, prompt, None, max_new_tokens=48, chat=True)
    spec = specq.generate(target, prompt, draft, gamma=4, max_new_tokens=48, chat=True)
    assert spec.token_ids == base.token_ids
