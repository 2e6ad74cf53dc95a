"""A sequence draft with a narrowed head (`weights.narrow_head`): it proposes kept tokens only, its
q is zero elsewhere, and speculative decoding stays the target's own, greedy and sampled."""

from __future__ import annotations

import copy

import pytest
import torch

from specq import generate
from specq.core.sampling import SamplingConfig
from specq.drafters.sequence import SequenceDrafter
from specq.errors import SpecqError
from specq.core.types import Model
from specq.loading.vocab import check_target
from specq.weights.narrow_head import NarrowHead, narrow_linear

from conftest import (_exact_sequence_distribution, assert_speculative_is_plain, chi_square_p,
                      perturbed, tiny_model)


def narrowed(model: Model, keep: list[int]) -> Model:
    net = copy.deepcopy(model.net)
    net.output = narrow_linear(net.output, torch.tensor(keep))
    return Model(ref=f"{model.ref}-narrow", net=net, tokenizer=model.tokenizer,
                 eos_ids=model.eos_ids, source=model.source)


def test_kept_logits_are_the_heads_own_and_the_rest_never_drafted():
    model = tiny_model(scale=3.0)
    keep = [0, 3, 4, 9, 17, 31]
    draft = narrowed(model, keep)
    ids = torch.tensor([1, 2, 3, 4])
    with torch.inference_mode():
        full, narrow = model.net(ids), draft.net(ids)
    outside = torch.ones(32, dtype=torch.bool)
    outside[keep] = False
    # the same rows (sgemm may round by row count)
    torch.testing.assert_close(narrow[:, keep], full[:, keep])
    assert torch.isneginf(narrow[:, outside]).all()
    drafter = SequenceDrafter(draft, 32)
    drafter.start(torch.tensor([1, 2, 3]), 64)
    proposal = drafter.propose([1, 2, 3], 4, SamplingConfig(temperature=1.0),
                               torch.Generator().manual_seed(0))
    assert set(proposal.tokens.tolist()) <= set(keep)
    assert ((proposal.probs[:, outside] == 0).all()
            and torch.allclose(proposal.probs.sum(-1), torch.ones(4)))


def test_greedy_speculation_with_a_narrowed_head_is_plain_decoding():
    """Accepted and rejected drafts both happen, the rejections partly because the target's token
    is outside the head."""
    target = tiny_model(scale=3.0)
    draft = narrowed(perturbed(target, 0.3), list(range(0, 32, 2)) + [1, 3])
    plain = generate(target, [1, 2, 3], None, max_new_tokens=24).token_ids
    # the target writes tokens the draft cannot
    assert set(plain) - set(draft.net.output.keep.tolist())
    assert_speculative_is_plain(target, draft)


def test_sampling_with_a_narrowed_head_follows_the_target():
    prompt = [1, 2]
    target = tiny_model(vocab=5, hidden=16, scale=1.0, seed=11)
    draft = narrowed(perturbed(target, 0.3), [0, 1, 3])  # tokens 2 and 4 are never drafted
    exact = _exact_sequence_distribution(target, prompt, 3, SamplingConfig(temperature=1.0))
    runs, counts, accepted, rejected = 2000, dict.fromkeys(exact, 0), 0, 0
    for seed in range(runs):
        out = generate(target, prompt, draft, gamma=2, max_new_tokens=3, temperature=1.0, seed=seed,
                       draft_confidence=0.0)
        counts[tuple(out.token_ids)] += 1
        accepted += out.stats.accepted
        rejected += out.stats.drafted - out.stats.accepted
    assert accepted > 0 and rejected > 0
    # the target's own tokens still come
    assert sum(n for seq, n in counts.items() if {2, 4} & set(seq)) > 0
    assert chi_square_p(counts, exact, runs) > 0.001


def test_a_narrowed_head_is_no_target():
    with pytest.raises(SpecqError, match="narrowed head"):
        check_target(narrowed(tiny_model(), [1, 2, 3]))


def test_bad_kept_ids_are_refused():
    head = tiny_model().net.output
    for keep in ([1, 1], [40]):
        with pytest.raises(ValueError):
            NarrowHead(head, torch.tensor(keep), 32)
