"""Model drafts that read only the prompt's last W tokens (`MODEL:window=W`): the target's output
unchanged (greedy token for token, sampling in distribution, drafts accepted and rejected), the
draft's prefill cut to the window, and a bad window refused before any model loads."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import specq

from specq.cli import main
from specq.core.sampling import SamplingConfig
from specq.drafters import SequenceDrafter
from specq.errors import SpecqError
from specq.loading import kinds
from specq.loading.refs import model_ref
from specq.loading.formats.save import save_native

from conftest import (_exact_sequence_distribution, assert_speculative_is_plain, chi_square_p,
                      perturbed, sampled_outputs, tiny_model)


def windowed(model, window: int):
    return replace(model, ref=f"{model.ref}:window={window}",
                   info={**model.info, "draft_window": window})


def test_a_windowed_draft_keeps_greedy_output_and_drafts_from_the_window():
    target = tiny_model(scale=3.0)
    draft = windowed(perturbed(target, 0.05), 2)
    drafter = kinds.for_pair(draft, target)
    assert isinstance(drafter, SequenceDrafter) and drafter.window == 2
    prompt = [7, 7, 8, 9, 10, 11]
    assert_speculative_is_plain(target, draft, ([1, 2, 3], [5], prompt, prompt * 4))
    # 24 prompt tokens: the draft reads the 2 before the last
    drafter.start(torch.tensor(prompt * 4), 64)
    assert drafter.skipped == 21 and drafter.cache.length == 2


def test_a_drafter_rolled_back_before_it_proposes_keeps_its_prefill():
    """ngram+MODEL: the lookup may propose first; the model, told of that step, keeps what it read
    of the prompt (its cache was once emptied, and a window's cropped below zero)."""
    target = tiny_model(scale=3.0)
    prompt = torch.tensor([7, 7, 8, 9, 10, 11] * 4)
    for window in (None, 2):
        draft = (perturbed(target, 0.05)
                 if window is None else windowed(perturbed(target, 0.05), window))
        drafter = kinds.for_pair(draft, target)
        drafter.start(prompt, 64)
        read = drafter.cache.length
        assert read == (23 if window is None else 2)
        drafter.rollback(len(prompt) + 3, None, [])  # another drafter's three tokens were accepted
        assert drafter.cache.length == read
    model = perturbed(target, 0.05)
    for draft in (specq.NgramDraft(fallback=model), specq.NgramDraft(fallback=windowed(model, 2))):
        for p in ([3, 4, 5, 6, 7, 3, 4, 5, 6, 7, 3, 4], [7, 7, 8, 9, 10, 11] * 4):
            assert specq.generate(target, p, draft, max_new_tokens=30).token_ids == \
                specq.generate(target, p, None, max_new_tokens=30).token_ids


def test_a_windowed_draft_samples_the_targets_distribution():
    """A window of 1 drafts from much less than the target sees; with its drafts accepted and
    rejected, the first three sampled tokens follow the target's joint distribution (chi-square)."""
    prompt = [1, 2, 3, 4]
    target = tiny_model(vocab=5, hidden=16, scale=1.0, seed=11)
    draft = windowed(tiny_model(vocab=5, hidden=16, scale=1.5, seed=12), 1)
    exact = _exact_sequence_distribution(target, prompt, 3, SamplingConfig(temperature=1.0))
    runs = 1000
    counts, rejected = sampled_outputs(target, draft, prompt, runs)
    assert rejected > runs // 5
    assert chi_square_p(counts, exact, runs) > 0.001


def test_the_window_is_read_from_the_ref(tmp_path):
    save_native(tiny_model(), tmp_path / "draft")
    draft = kinds.load(f"{tmp_path / 'draft'}:window=16")
    assert draft.info["draft_window"] == 16 and draft.ref.endswith(":window=16")
    assert model_ref("smollm2-135m@int8").window is None
    windowed = model_ref("smollm2-135m@int8:window=16")
    assert (windowed.base, windowed.window) == ("smollm2-135m@int8", 16)
    for bad in ("x:window=0", "x:window=-3", "x:window=abc", ":window=4"):
        with pytest.raises(SpecqError, match="window"):
            model_ref(bad)
    with pytest.raises(SpecqError, match="applies to model drafts"):
        kinds.load("ngram:window=8")


@pytest.mark.parametrize("draft", ["smollm2-135m:window=0", "smollm2-135m:window=x",
                                   "ngram+smollm2-135m:window="])
def test_a_bad_window_is_one_line_and_exit_2_before_any_model_loads(draft, capsys):
    code = main(["generate", "t1", "--target", "smollm2-135m", "--draft", draft,
                 "--max-new-tokens", "2"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err and "window" in err, err
