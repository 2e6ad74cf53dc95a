"""The cheaper 0.5B drafts of the Qwen2.5-Coder pair (`@gguf-int4`, `@gguf-head32k`, `-keep18`; `make test-real`):
they load from the packaged file, run on specq's kernels, and the target's output is unchanged."""

from __future__ import annotations

import pytest
from test_real_pair import needs_pair

import specq
from specq import backends
from specq.bench.coding import CODE_TASKS, EDIT_TASKS
from specq.weights.narrow_head import NarrowHead

pytestmark = pytest.mark.real


@needs_pair
@pytest.mark.parametrize("spec", ["gguf-head32k", "gguf-int4-head32k", "gguf-int4-head32k-keep18"])
def test_cheaper_draft_speculates_losslessly_on_the_pair(spec):
    target, draft = specq.load("qwen2.5-coder-1.5b"), specq.load(f"qwen2.5-coder-0.5b@{spec}")
    assert draft.precision == spec and isinstance(draft.net.output, NarrowHead)
    assert 32768 <= draft.net.output.keep.numel() < 33500  # the ranked tokens and the special ones
    assert len(draft.net.layers) == (18 if spec.endswith("keep18") else 24)
    described = backends.describe(draft.net)
    assert described["layer_stack"] and all("int8dot" in kernel for kernel in described["linear_layers"])
    for prompt in (CODE_TASKS[0], EDIT_TASKS[0]):
        plain = specq.generate(target, prompt, None, max_new_tokens=64, chat=True, ignore_eos=True)
        fast = specq.generate(target, prompt, draft, gamma=4, max_new_tokens=64, chat=True, ignore_eos=True,
                              draft_confidence=0.0)
        assert fast.token_ids == plain.token_ids
        assert 0 < fast.stats.accepted < fast.stats.drafted  # accepts and rejects both happened
