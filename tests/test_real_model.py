"""The embedded SmolLM2-135M target: lossless speculative decoding on a real model."""

import copy
import dataclasses

import pytest

import specq
from specq.models import Model, default_draft_ref

PROMPTS = [("The capital of France is", False),
           ("Write a short poem about the sea.", True),
           ("What is 17 times 23? Think step by step.", True)]


@pytest.fixture(scope="module")
def draft(real_target):
    ref = default_draft_ref("smollm2-135m")
    if ref:
        return specq.load(ref)
    net = copy.deepcopy(real_target.net)  # no shipped draft yet: the first 4 layers of the target
    net.layers = net.layers[:4]
    net.config = dataclasses.replace(net.config, num_layers=4)
    return Model(ref="smollm2-135m-first4layers", net=net, tokenizer=real_target.tokenizer,
                 eos_ids=real_target.eos_ids, source="truncated target")


def test_builtin_target_answers(real_target):
    out = specq.generate(real_target, "The capital of France is", max_new_tokens=4)
    assert "Paris" in out.text


@pytest.mark.parametrize("prompt,chat", PROMPTS)
def test_greedy_speculative_equals_target(real_target, draft, prompt, chat):
    base = specq.generate(real_target, prompt, max_new_tokens=64, chat=chat)
    for gamma in (1, 2, 4, 8):
        spec = specq.generate(real_target, prompt, draft, gamma=gamma, max_new_tokens=64, chat=chat)
        assert spec.token_ids == base.token_ids, f"gamma={gamma}"
        assert spec.text == base.text


def test_quantized_real_target_stays_lossless(draft):
    target = specq.load("smollm2-135m@int4-g64-rtn")  # packed int4 kernel
    prompt = "Give me three tips for learning a new language."
    base = specq.generate(target, prompt, max_new_tokens=48, chat=True)
    spec = specq.generate(target, prompt, draft, gamma=4, max_new_tokens=48, chat=True)
    assert spec.token_ids == base.token_ids
