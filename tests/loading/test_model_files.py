"""Model folders specq writes are standard Hugging Face folders: other tools (transformers, vLLM,
llama.cpp's GGUF converter) read the architecture from config.json and load the weights."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from specq.loading import builtins, kinds
from specq.loading.formats.save import save_native
from specq.model.feature_draft import CONFIG_FILE, KIND

from conftest import tiny_model

SHIPPED = builtins.ASSETS / "drafts"
CAUSAL_LM_DRAFTS = [n for n in builtins.SHIPPED_DRAFTS if (SHIPPED / n / "config.json").is_file()]


def _same_logits(directory, native) -> None:
    hf = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    assert hf.config.architectures == ["LlamaForCausalLM"]
    ids = torch.tensor([1, 5, 9, 2, 7])
    with torch.no_grad():
        expected = native(ids, None)
        got = hf(input_ids=ids[None]).logits[0]
    # the weights, not a random init
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_written_model_loads_in_transformers(tmp_path):
    model = tiny_model(scale=3.0)
    save_native(model, tmp_path / "m")
    _same_logits(tmp_path / "m", model.net)


def test_shipped_sequence_drafts_are_standard_causal_lms():
    assert len(CAUSAL_LM_DRAFTS) == 2
    for name in CAUSAL_LM_DRAFTS:
        _same_logits(SHIPPED / name, kinds.load(name).net)


@pytest.mark.parametrize("name", sorted(set(builtins.SHIPPED_DRAFTS) - set(CAUSAL_LM_DRAFTS)))
def test_feature_draft_does_not_pose_as_a_causal_lm(name):
    """A feature draft cannot generate alone (it reads the target's hidden states), so its folder
    has no config.json for a tool to misread; feature_draft.json names what it is."""
    assert json.loads((SHIPPED / name / CONFIG_FILE).read_text())["kind"] == KIND
