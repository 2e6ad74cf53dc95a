"""The cheaper 0.5B drafts of the Qwen2.5-Coder pair (`@gguf-int4`, `@gguf-head32k`,
`-keep18`; `make test-real`):
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
    described = backends.describe(draft.runner)
    assert (described["layer_stack"]
            and all("int8dot" in kernel for kernel in described["linear_layers"]))
    for prompt in (CODE_TASKS[0], EDIT_TASKS[0]):
        plain = specq.generate(target, prompt, None, max_new_tokens=64, chat=True, ignore_eos=True)
        fast = specq.generate(target, prompt, draft, gamma=4, max_new_tokens=64, chat=True,
                              ignore_eos=True, draft_confidence=0.0)
        assert fast.token_ids == plain.token_ids
        assert 0 < fast.stats.accepted < fast.stats.drafted  # accepts and rejects both happened


@needs_pair
def test_an_adapter_merges_into_the_real_files_4bit_body(tmp_path, monkeypatch):
    """A LoRA adapter (random factors, peft's layout) on the 0.5B file: every weight it touches,
    Q4_K and Q6_K blocks included, is requantized with its product; the draft runs on the kernels
    and the target's output is unchanged."""
    import json

    import torch
    from safetensors.torch import save_file

    from specq.loading import file_spec

    # a fresh 4-bit body, not the kernels'
    monkeypatch.setattr(file_spec, "cache_dir", lambda: tmp_path / "cache")
    g = torch.Generator().manual_seed(0)
    factors = {}
    for i in range(24):
        for module, (rows, cols) in {"self_attn.q_proj": (896, 896),
                                     "mlp.down_proj": (896, 4864)}.items():
            key = f"base_model.model.model.layers.{i}.{module}"
            factors[f"{key}.lora_A.weight"] = torch.randn(4, cols, generator=g).half() * 0.01
            factors[f"{key}.lora_B.weight"] = torch.randn(rows, 4, generator=g).half() * 0.01
    (tmp_path / "lora").mkdir()
    save_file(factors, str(tmp_path / "lora" / "adapter_model.safetensors"))
    (tmp_path / "lora" / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "base_model_name_or_path": "qwen2.5-coder-0.5b", "r": 4,
         "lora_alpha": 8}))
    target, draft = (specq.load("qwen2.5-coder-1.5b"),
                     specq.load(f"{tmp_path / 'lora'}@gguf-int4-head32k"))
    assert ("adapter" in draft.net.layers[0].feed_forward.w2.kind
            and draft.net.layers[0].feed_forward.w2.bits == 4)
    # untouched: the plain 4-bit body's
    assert "adapter" not in draft.net.layers[0].feed_forward.w13.kind
    described = backends.describe(draft.runner)
    assert (described["layer_stack"]
            and all("int8dot" in kernel for kernel in described["linear_layers"]))
    plain = specq.generate(target, CODE_TASKS[0], None, max_new_tokens=64, chat=True,
                           ignore_eos=True)
    fast = specq.generate(target, CODE_TASKS[0], draft, gamma=4, max_new_tokens=64, chat=True,
                          ignore_eos=True, draft_confidence=0.0)
    assert fast.token_ids == plain.token_ids
    assert 0 < fast.stats.accepted < fast.stats.drafted
