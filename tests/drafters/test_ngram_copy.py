"""An n-gram draft's copy route (`ngram:c=C`): where the match agrees with the text's end over more
than n_max tokens the lookup proposes up to C tokens on a route of its own; lossless, greedy and
sampling, both routes' proposals accepted and rejected; and long proposals where a target copies."""

import pytest
import torch

import specq
from specq.core.decode import Sequence, run
from specq.core.gamma import CostAwareGamma
from specq.core.sampling import SamplingConfig
from specq.drafters import FallbackDrafter, NgramDraft, NgramDrafter
from specq.drafters.ngram import COPY, LOOKUP

from conftest import (NGRAM_PROMPTS, _exact_sequence_distribution, chi_square_p, ngram_index,
                      perturbed, tiny_model)


pytestmark = pytest.mark.usefixtures("one_thread")

def test_a_match_that_agrees_past_n_max_is_a_copy():
    copying = ngram_index([1, 2, 3, 4, 9, 1, 2, 3, 4])  # the last 4 tokens agree: more than n_max 3
    assert copying.copies(copying.match())
    matching = ngram_index([5, 2, 3, 4, 9, 1, 2, 3, 4])  # only (2, 3, 4): n_max tokens
    assert matching.match() == 4 and not matching.copies(matching.match())
    assert not ngram_index([2, 3, 4, 9, 1, 2, 3, 4]).copies(3)  # nothing before the match


def test_the_drafter_proposes_up_to_c_where_the_text_copies():
    sampling, g = SamplingConfig(), torch.Generator()
    passage = list(range(10, 40))
    drafter = NgramDrafter(NgramDraft(k=3, copy=12))
    drafter.start(torch.tensor(passage + [1, 2]), 64, None)
    seq = passage + [1, 2] + passage[:5]  # copying the passage: 5 tokens agree
    assert drafter.route_after(seq) == COPY and drafter.routes(seq) == [COPY]
    proposal = drafter.propose(seq, 16, sampling, g)
    assert proposal.tokens.tolist() == passage[5:17] and drafter.proposed() == COPY
    assert drafter.propose(seq, 7, sampling, g).tokens.tolist() == passage[5:12]  # the step's cap
    seq += [50, 10, 11]  # a fresh match of 2 tokens: a lookup, up to k
    assert drafter.route_after(seq) == LOOKUP
    assert drafter.propose(seq, 16, sampling, g).tokens.tolist() == passage[2:5]
    assert drafter.proposed() == LOOKUP
    assert drafter.longest(COPY, 64) == 12 and drafter.longest(LOOKUP, 64) == 3
    assert drafter.nodes(64) == 12 and drafter.nodes(5) == 5
    unmatched = seq + [60, 61]
    assert drafter.route_after(unmatched) is None and drafter.routes(unmatched) == [LOOKUP]
    no_copy = NgramDrafter(NgramDraft(k=3, copy=0))  # every match is a lookup
    no_copy.start(torch.tensor(passage + [1, 2]), 64, None)
    assert no_copy.route_after(passage + [1, 2] + passage[:5]) == LOOKUP


def test_the_run_is_as_long_as_the_longest_route():
    assert NgramDraft(k=4, copy=16).longest(2) == 16
    assert NgramDraft(k=4, copy=0).longest(2) == 4
    target = tiny_model(scale=3.0, seed=4)
    assert NgramDraft(k=4, copy=3, fallback=target).longest(6) == 6


def _greedy(target, draft, **options) -> dict[str, dict[str, int]]:
    """Each prompt's output with `draft` is the target's own; the steps per route, summed."""
    routes: dict[str, dict[str, int]] = {}
    for prompt in NGRAM_PROMPTS:
        base = specq.generate(target, prompt, None, max_new_tokens=60)
        spec = specq.generate(target, prompt, draft, max_new_tokens=60, **options)
        assert spec.token_ids == base.token_ids
        for route, counts in spec.stats.routes.items():
            total = routes.setdefault(route, dict.fromkeys(counts, 0))
            for key, value in counts.items():
                total[key] += value
    return routes


@pytest.mark.parametrize("fallback", [False, True], ids=["alone", "with a model fallback"])
@pytest.mark.parametrize("gamma", [2, "auto"])
def test_greedy_with_a_copy_route_equals_the_target(fallback, gamma):
    target = tiny_model(scale=3.0, seed=4)
    draft = NgramDraft(k=2, copy=16, fallback=perturbed(target, 0.3, seed=2) if fallback else None)
    routes = _greedy(target, draft, gamma=gamma)
    copy = routes[COPY]
    assert copy["accepted"] > 0 and copy["drafted"] > copy["accepted"]  # accepted and rejected
    assert routes[LOOKUP]["drafted"] > 0 and routes["plain"]["steps"] > 0
    assert not fallback or routes["model"]["accepted"] > 0


def test_sampling_with_a_copy_route_follows_the_target():
    """Seeded runs of 4 tokens vs the target's exact joint distribution (chi-square): the copy
    route proposes 2 point masses where a lookup proposes 1, and both are accepted and rejected."""
    prompt, new, runs = [1, 2, 3, 1, 2], 4, 2000
    target = tiny_model(vocab=5, hidden=16, scale=1.0, seed=12)
    draft = NgramDraft(2, 1, 1, copy=2)
    exact = _exact_sequence_distribution(target, prompt, new, SamplingConfig(temperature=1.0))
    counts: dict[tuple, int] = {}
    routes = {COPY: [0, 0, 0], LOOKUP: [0, 0, 0]}
    for seed in range(runs):
        out = specq.generate(target, prompt, draft, gamma=1, max_new_tokens=new,
                             temperature=1.0, seed=seed)
        counts[tuple(out.token_ids)] = counts.get(tuple(out.token_ids), 0) + 1
        for route, total in routes.items():
            step = out.stats.routes.get(route, {"steps": 0, "drafted": 0, "accepted": 0})
            total[0] += step["steps"]
            total[1] += step["drafted"]
            total[2] += step["accepted"]
    for steps, drafted, accepted in routes.values():
        assert accepted > runs // 20 and drafted - accepted > runs // 20
    assert routes[COPY][1] > routes[COPY][0]  # copies of more than one token
    assert routes[LOOKUP][1] == routes[LOOKUP][0]  # lookups of k = 1
    assert chi_square_p(dict.fromkeys(exact, 0) | counts, exact, runs) > 0.001


class CopyingTarget:
    """A target that writes `text` greedily, as a model returning an edited file whole does where
    the file is unchanged: after any prefix of `text` its logits pick the next token (elsewhere
    token 0). Its passes take no real time: gamma auto's costs are scripted."""

    def __init__(self, text: list[int], vocab: int):
        self.text, self.vocab = text, vocab
        self.runner, self.tokenizer, self.eos_ids, self.ref = self, None, frozenset(), "copying"

    def new_cache(self, capacity: int):
        return _Cache()

    def forward_many(self, seqs, return_hidden=False):
        out = []
        for rows in seqs:
            ids, at = rows.ids.tolist(), rows.cache.length
            logits = torch.zeros(len(ids), self.vocab)
            for i in range(len(ids)):
                if ids[:i + 1] == self.text[at:at + i + 1] and at + i + 1 < len(self.text):
                    logits[i, self.text[at + i + 1]] = 1
            rows.cache.length += len(ids)
            out.append((logits[-1:] if rows.last_only else logits, None))
        return out


class _Cache:
    length = 0

    def keep(self, start: int, rows: torch.Tensor) -> None:
        self.length = start + len(rows)

    def crop(self, length: int) -> None:
        self.length = min(self.length, length)


def _scripted_costs(monkeypatch):
    """Costs as on a CPU: a lookup's tokens cost no drafting, each verify row a twentieth of a
    one-row pass."""
    observe = CostAwareGamma.observe
    monkeypatch.setattr(CostAwareGamma, "observe",
                        lambda self, cap, drafted, accepted, _d, _v, nodes=None:
                        observe(self, cap, drafted, accepted, 0.0, 1 + (nodes or drafted) / 20))


def copied_steps(draft: NgramDraft, monkeypatch) -> list[int]:
    """Tokens accepted per step, gamma auto, where the target returns a passage of its prompt
    whole (after one changed token): the output is the target's."""
    _scripted_costs(monkeypatch)
    passage = list(range(10, 90))
    prompt = [1] + passage + [2, 3]
    text = prompt + [4] + passage  # the target's output: 4, then the passage
    target = CopyingTarget(text, 100)
    sequence = Sequence(target, prompt, drafter=NgramDrafter(draft), gamma=draft.longest(4),
                        adaptive=True, max_new_tokens=len(passage) + 1, ignore_eos=True)
    ids, _, stats = run(sequence)
    assert ids == text[len(prompt):]
    return [a - b for a, b in zip(stats.accepted_at, stats.accepted_at[1:] + [0])]


def test_a_copied_passage_is_proposed_past_k(monkeypatch):
    """Steps that accept more than k = 4 tokens: none without a copy route, most of the passage
    with one."""
    without = copied_steps(NgramDraft(k=4, copy=0), monkeypatch)
    assert len(without) == 4
    steps = copied_steps(NgramDraft(k=4, copy=16), monkeypatch)
    assert sum((n + 1) * count for n, count in enumerate(steps) if n >= 4) > 40


def test_gamma_auto_prices_copies_and_matches_apart(monkeypatch):
    """ngram:c=C+MODEL: three routes, each with its own chooser up to its own length."""
    target = tiny_model(scale=3.0, seed=4)
    draft = NgramDraft(k=3, copy=16, fallback=perturbed(target, 0.3, seed=2))
    routes = set()
    for prompt in NGRAM_PROMPTS:
        sequence = specq.api.start(target, prompt, draft, gamma="auto", max_new_tokens=60)
        run(sequence)
        routes |= set(sequence.choosers)
        for name, chooser in sequence.choosers.items():
            assert chooser.max_gamma == {COPY: 16, LOOKUP: 3, "model": 4}[name]
    assert routes == {COPY, LOOKUP, "model"}
    drafter = specq.api.start(target, NGRAM_PROMPTS[0], draft, gamma="auto").drafter
    assert isinstance(drafter, FallbackDrafter) and drafter.nodes(16) == 16


def test_the_default_proposes_a_copied_passage_past_k(monkeypatch):
    """The default n-gram draft (and so every default draft's lookup) has a copy route: a passage
    the target copies is proposed in steps longer than k, not k at a time."""
    default = NgramDraft()
    assert default.copy > default.k and default.ref == "ngram:n=2-3:k=4:c=16"
    steps = copied_steps(default, monkeypatch)
    assert sum((n + 1) * count for n, count in enumerate(steps) if n >= default.k) > 40
