"""Speculative output is the target's own: greedy token for token, sampling in distribution."""


import pytest
import torch

from specq import generate
from specq.backends.runner import CompiledRunner
from specq.core.decode import decode
from specq.core.sampling import SamplingConfig
from specq.core.types import Proposal

from conftest import (PROMPTS, _exact_sequence_distribution, chi_square_p, tiny_hf_qwen2, perturbed,
                      tiny_model)


@pytest.mark.parametrize("gamma", [1, 2, 4, 8])
@pytest.mark.parametrize("noise", [0.05, 0.5])
@pytest.mark.parametrize("confidence", [0.0, 0.6])
def test_greedy_equality_native(gamma, noise, confidence):
    target = tiny_model(scale=3.0)
    draft = perturbed(target, noise)
    accepted = rejected = 0
    for prompt in PROMPTS:
        base = generate(target, prompt, None, max_new_tokens=40)
        spec = generate(target, prompt, draft, gamma=gamma, max_new_tokens=40,
                        draft_confidence=confidence)
        assert spec.token_ids == base.token_ids
        assert len(spec.token_ids) == 40
        accepted += spec.stats.accepted
        rejected += spec.stats.drafted - spec.stats.accepted
    assert rejected > 0  # the reject path ran
    if noise < 0.1:
        assert accepted > 0  # and the accept path


def test_greedy_equality_other_draft_architecture():
    """A draft with other depth and width, and a vocabulary padded with unused rows."""
    target = tiny_model(vocab=32, scale=3.0)
    draft = tiny_model(vocab=40, layers=1, hidden=16, seed=5, ref="other")
    draft.tokenizer = target.tokenizer
    for prompt in PROMPTS:
        base = generate(target, prompt, None, max_new_tokens=30)
        assert (generate(target, prompt, draft, gamma=3, max_new_tokens=30).token_ids
                == base.token_ids)


@pytest.mark.parametrize("gamma", [1, 4])
def test_greedy_equality_transformers_backend(gamma):
    """A non-Llama target runs through transformers' own cache and stays lossless."""
    target = tiny_hf_qwen2(0)
    draft = tiny_model(scale=3.0, seed=2)  # native draft, transformers target
    for prompt in PROMPTS:
        base = generate(target, prompt, None, max_new_tokens=24)
        assert (generate(target, prompt, draft, gamma=gamma, max_new_tokens=24).token_ids
                == base.token_ids)


class _Scripted:
    """Proposes the target's own next two tokens, then a wrong one: a known
    accept/reject pattern."""

    def __init__(self, expected: list[int], vocab: int):
        self.expected, self.vocab = expected, vocab

    needs_target_features = False

    def start(self, prompt, capacity, features=None):
        self.offset = len(prompt)

    def nodes(self, gamma):
        return gamma

    def propose(self, seq, gamma, sampling, generator):
        truth = self.expected[len(seq) - self.offset:][:gamma]
        tokens = truth[:2] + [(t + 1) % self.vocab for t in truth[2:]]
        return Proposal.chain(torch.tensor(tokens, dtype=torch.long))

    def rollback(self, length, features, path):
        pass


def test_stats_count_a_known_accept_reject_pattern():
    """Every 4-token proposal has 2 right tokens then wrong ones: 2 accepted and one bonus per
    step, until the budget shortens the last proposals (50 tokens: 1 from prefill, 15 steps of 3,
    one of 3 tokens from a 3-token proposal, one plain step)."""
    target = tiny_model(scale=3.0)
    expected = generate(target, [1, 2, 3], None, max_new_tokens=50).token_ids
    ids, _, s = decode(target, [1, 2, 3], drafter=_Scripted(expected, target.vocab_size), gamma=4,
                       max_new_tokens=50)
    assert ids == expected
    assert (s.steps, s.drafted, s.accepted, s.emitted, s.new_tokens) == (17, 63, 32, 49, 50)
    assert s.tau == pytest.approx(49 / 17) and s.acceptance_rate == pytest.approx(32 / 63)
    assert s.drafted_at == [16, 16, 16, 15] and s.accepted_at == [16, 16, 0, 0]
    assert s.per_position_unconditional == [1.0, 1.0, 0.0, 0.0]
    assert s.per_position_conditional == [1.0, 1.0, 0.0, None]  # position 4 never reached
    plain = generate(target, [1, 2, 3], None, max_new_tokens=50).stats
    assert (plain.tau, plain.steps, plain.drafted) == (1.0, 49, 0)


class _Seeing(_Scripted):
    """_Scripted that also sees every verify row (`types.SeesVerify`) and logs the calls."""

    def __init__(self, expected: list[int], vocab: int):
        super().__init__(expected, vocab)
        self.calls = []

    def propose(self, seq, gamma, sampling, generator):
        proposal = super().propose(seq, gamma, sampling, generator)
        self.before, self.rows = list(seq[:-1]), seq[-1:] + proposal.tokens.tolist()
        return proposal

    def verified(self, choices):
        self.calls.append(("verified", self.before, self.rows, choices.tolist()))

    def rollback(self, length, features, path):
        self.calls.append(("rollback", path))


def test_a_drafter_that_sees_verify_gets_the_target_choice_at_every_row():
    """Rows past a rejection included (what lookahead's window guesses next), before rollback;
    a drafter without `verified` is not asked."""
    target = tiny_model(scale=3.0)
    expected = generate(target, [1, 2, 3], max_new_tokens=12).token_ids
    drafter = _Seeing(expected, target.vocab_size)
    ids, _, _ = decode(target, [1, 2, 3], drafter=drafter, gamma=4, max_new_tokens=12)
    assert ids == expected
    verified = [call for call in drafter.calls if call[0] == "verified"]
    assert [call[0] for call in drafter.calls] == ["verified", "rollback"] * len(verified)
    for _, before, rows, choices in verified:
        with torch.inference_mode():
            logits = target.runner(torch.tensor(before + rows), None)[len(before):]
        assert choices == logits.argmax(-1).tolist() and len(choices) == len(rows)
    assert any(len(call[2]) == 5 for call in verified)  # 4 nodes: 2 past the rejection
    assert not hasattr(_Scripted, "verified")


def test_confidence_stop_shortens_proposals():
    target = tiny_model(scale=3.0)
    draft = perturbed(target, 0.05)
    full = generate(target, [1, 2, 3], draft, gamma=4, max_new_tokens=50,
                    draft_confidence=0.0).stats
    cut = generate(target, [1, 2, 3], draft, gamma=4, max_new_tokens=50, draft_confidence=0.9).stats
    # without the stop only the token budget shortens proposals: the last few steps at most
    assert full.drafted_at[0] - full.drafted_at[3] <= 3
    assert cut.drafted_at[0] - cut.drafted_at[3] > 3


def test_stops_never_emit_past_eos_or_stop_string():
    target = tiny_model(scale=3.0)
    base = generate(target, [1, 2, 3], None, max_new_tokens=30).token_ids
    eos = base[10]
    first = base.index(eos)
    stopper = tiny_model(scale=3.0, eos=(eos,))
    draft = perturbed(stopper, 0.05)
    for d in (None, draft):
        out = generate(stopper, [1, 2, 3], d, gamma=4, max_new_tokens=30)
        assert out.token_ids == base[: first + 1] and out.finish_reason == "eos"
    word = target.tokenizer.decode([base[5]])
    cut = next(i for i, t in enumerate(base) if t == base[5])
    for d in (None, draft):
        out = generate(target, [1, 2, 3], d, gamma=4, max_new_tokens=30, stop=[word])
        assert out.token_ids == base[: cut + 1] and out.finish_reason == "stop"
        assert word not in out.text.split()


@pytest.mark.parametrize("cfg,confidence", [(SamplingConfig(temperature=1.0), 0.0),
                                            (SamplingConfig(temperature=0.7, top_k=3, top_p=0.9),
                                             0.0),
                                            (SamplingConfig(temperature=1.0), 0.5)])
def test_sampling_distribution_matches_target(cfg, confidence):
    """Seeded runs of speculative sampling vs the target's computed joint distribution of the
    first three new tokens (two of which come from verify passes): chi-square, deterministic."""
    prompt = [1, 2]
    target = tiny_model(vocab=5, hidden=16, scale=1.0, seed=11)
    draft = tiny_model(vocab=5, hidden=16, scale=1.5, seed=12)  # a poor draft: many rejections
    exact = _exact_sequence_distribution(target, prompt, 3, cfg)
    runs = 3000
    counts = dict.fromkeys(exact, 0)
    rejected = 0
    for seed in range(runs):
        out = generate(target, prompt, draft, gamma=2, max_new_tokens=3,
                       temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p, seed=seed,
                       draft_confidence=confidence)
        counts[tuple(out.token_ids)] += 1
        rejected += out.stats.drafted - out.stats.accepted
    assert rejected > runs // 4
    assert chi_square_p(counts, exact, runs) > 0.001


def test_compiled_static_path_stays_lossless():
    """The torch.compile path (padded inputs, whole-buffer attention) gives the eager output.
    The 'eager' backend traces the same graph without the minute-long C++ code generation."""
    target = tiny_model(scale=3.0)
    draft = perturbed(target, 0.05)
    base = generate(target, [1, 2, 3], draft, gamma=3, max_new_tokens=30)
    target.runner = CompiledRunner(target.net, inductor="eager")
    draft.runner = CompiledRunner(draft.net, inductor="eager")
    for gamma in (3, 4):
        assert (generate(target, [1, 2, 3], draft, gamma=gamma, max_new_tokens=30).token_ids
                == base.token_ids)
    assert generate(target, [1, 2, 3], None, max_new_tokens=30).token_ids == base.token_ids


def test_on_tokens_streams_exactly_the_output_and_can_cancel():
    target = tiny_model(scale=3.0)
    draft = perturbed(target, 0.1)
    chunks = []
    out = generate(target, [1, 2, 3], draft, max_new_tokens=30, stop=None,
                   on_tokens=lambda ids: chunks.append(ids) or True)
    assert [t for c in chunks for t in c] == out.token_ids and len(chunks) > 1
    assert any(len(c) > 1 for c in chunks)  # speculative steps stream several tokens at once
    calls = []
    cut = generate(target, [1, 2, 3], draft, max_new_tokens=30,
                   on_tokens=lambda ids: calls.append(ids) and False)
    assert (cut.finish_reason == "cancelled"
            and cut.token_ids == calls[0] == out.token_ids[:len(calls[0])])
    assert len(calls) == 1 and len(cut.token_ids) < len(out.token_ids)
