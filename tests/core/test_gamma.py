"""gamma "auto": the cost-aware choice, and losslessness under any per-step schedule."""

import pytest
import torch

from specq import api, generate
from specq.core.gamma import (AUTO_MAX_GAMMA, CARRIED_ACCEPTANCE, MAX_KEPT, MIN_EVIDENCE,
                              PROBE_EVERY, CostAwareGamma, GammaMemory, parse)
from specq.core.sampling import SamplingConfig
from specq.core.stats import DecodeStats
from specq.errors import SpecqError

from conftest import (PROMPTS, _exact_sequence_distribution, _feature_model, at, chi_square_p,
                      perturbed, tiny_model)


def _run(chooser: CostAwareGamma, steps: int, accept: float, draft_s: float, verify_s,
         stop: float = 0.0, seed: int = 0) -> list[int]:
    """Drive `chooser` for `steps` simulated steps; returns the caps it chose. Each drafted token is
    accepted with probability `accept` (while all before it were); after each one the drafter
    stops early with probability `stop`; a draft forward costs `draft_s`, verifying n rows
    `verify_s(n)` seconds."""
    rng = torch.Generator().manual_seed(seed)
    caps = []
    for _ in range(steps):
        cap = chooser.next()
        drafted = 0
        while drafted < cap:
            drafted += 1
            if torch.rand(1, generator=rng).item() < stop:
                break
        accepted = 0
        while accepted < drafted and torch.rand(1, generator=rng).item() < accept:
            accepted += 1
        chooser.observe(cap, drafted, accepted, draft_s * drafted, verify_s(drafted + 1))
        caps.append(cap)
    return caps


def _linear(base: float, per_row: float):
    return lambda rows: base + per_row * (rows - 1)


def test_first_a_full_proposal_then_drafting_until_plain_decoding_may_be_weighed():
    """One rejected first proposal does not price the draft out: plain decoding is weighed (and
    first timed) only after MIN_EVIDENCE steps that drafted, however badly they went."""
    chooser = CostAwareGamma(3)
    assert chooser.next() == 3
    chooser.observe(3, 3, 0, 0.3, 1.6)
    for _ in range(MIN_EVIDENCE - 1):
        cap = chooser.next()
        assert cap >= 1
        chooser.observe(cap, cap, 0, 0.1 * cap, 1.0 + 0.2 * cap)
    assert chooser.next() == 0
    chooser.observe(0, 0, 0, 0.0, 1.0)
    assert chooser.verify_cost(1) == 1.0 and chooser.verify_cost(4) == 1.6
    assert chooser.verify_cost(1.5) == pytest.approx(1.1)  # interpolated between the counts timed
    assert chooser.next() == 0  # drafting, all rejected, does not pay


def test_plain_decoding_when_the_draft_does_not_pay_with_probes_ever_rarer():
    chooser = CostAwareGamma(4)
    picks = _run(chooser, 250, accept=0.0, draft_s=0.3, verify_s=_linear(1.0, 0.1))
    assert all(picks[:MIN_EVIDENCE]) and picks[MIN_EVIDENCE] == 0
    tries = [i for i, cap in enumerate(picks) if cap][MIN_EVIDENCE - 1:]
    gaps = [b - a - 1 for a, b in zip(tries, tries[1:])]  # plain steps between tries
    # each unchanged probe doubles the wait
    assert gaps[:3] == [PROBE_EVERY, 2 * PROBE_EVERY, 4 * PROBE_EVERY]
    # beyond that, fading evidence (COUNT_DECAY) has the draft tried about every 30 steps; probing
    # every PROBE_EVERY steps would have been 27 tries
    assert len(tries) <= 12 and picks.count(0) >= 232


def test_a_probe_that_changes_the_choice_resets_the_interval():
    chooser = CostAwareGamma(4)
    _run(chooser, 40, accept=0.0, draft_s=0.3, verify_s=_linear(1.0, 0.1))
    assert chooser.interval > PROBE_EVERY  # probes kept finding plain best
    # the draft starts to agree
    _run(chooser, 60, accept=1.0, draft_s=0.01, verify_s=_linear(1.0, 0.01), seed=2)
    assert chooser.next() == 4 and chooser.interval == PROBE_EVERY


def test_long_proposals_when_the_draft_agrees_and_is_cheap():
    chooser = CostAwareGamma(4)
    _run(chooser, 30, accept=0.95, draft_s=0.02, verify_s=_linear(1.0, 0.02))
    assert chooser.next() == 4


def test_costlier_drafts_get_shorter_proposals():
    cheap, costly = CostAwareGamma(4), CostAwareGamma(4)
    _run(cheap, 40, accept=0.6, draft_s=0.02, verify_s=_linear(1.0, 0.02))
    _run(costly, 40, accept=0.6, draft_s=0.25, verify_s=_linear(1.0, 0.02))
    assert 0 < costly.next() < cheap.next()


def _best(chooser: CostAwareGamma) -> int:
    """The cap the chooser's estimates favour (next() also probes now and then)."""
    return max(range(chooser.max_gamma + 1), key=chooser.tokens_per_second)


def test_a_verify_cost_that_is_flat_after_one_row_gets_long_proposals():
    """The fast path's shape: a second row costs most of what four do. A line through
    (rows, seconds) would charge every extra token the second row's price and stop short."""
    flat = lambda rows: 1.0 if rows == 1 else 1.2  # noqa: E731
    chooser = CostAwareGamma(4)
    picks = _run(chooser, 60, accept=0.7, draft_s=0.03, verify_s=flat)
    assert _best(chooser) == 4 and picks[-20:].count(4) >= 16
    steep = CostAwareGamma(4)  # the same draft where every row costs as much as the second
    _run(steep, 60, accept=0.7, draft_s=0.03, verify_s=_linear(1.0, 0.2))
    assert _best(steep) < 4


def test_an_early_stopping_drafter_is_priced_at_what_it_drafts():
    chooser = CostAwareGamma(4)
    _run(chooser, 60, accept=0.6, draft_s=0.1, verify_s=_linear(1.0, 0.05), stop=0.7)
    tokens, drafted = chooser.expected(4)
    assert drafted < 2.0  # stops after the first token 70% of the time: about 1.4 drafted, not 4
    assert 1.0 < tokens < 1 + drafted


def test_catching_up_after_plain_steps_does_not_price_drafting_out():
    """A drafter pays, on its first proposal after plain steps, for the tokens it missed (here
    1 s each, a verify pass 1 s). Counting that as the cost of a draft forward locked a self-draft
    out for good."""
    chooser = CostAwareGamma(4)
    rng = torch.Generator().manual_seed(0)
    missed, caps = 0, []
    for _ in range(80):
        cap = chooser.next()
        drafted = cap
        accepted = 0
        while accepted < drafted and torch.rand(1, generator=rng).item() < 0.8:
            accepted += 1
        catch_up = 1.0 * missed if drafted else 0.0
        missed = missed + 1 if not drafted else 0
        chooser.observe(cap, drafted, accepted, 0.1 * drafted + catch_up, 1.0 + 0.05 * drafted)
        caps.append(cap)
    assert caps[-20:].count(0) <= 4 and chooser.draft_s == pytest.approx(0.1)
    first_plain = caps.index(0)
    # drafting resumes soon
    assert first_plain == MIN_EVIDENCE and caps[first_plain + 1:first_plain + 11].count(0) < 10


def test_a_run_starts_from_what_the_last_run_of_the_pair_learned():
    """GammaMemory: the next run takes a copy of the kept chooser, so it starts from its costs and
    acceptance (no warm-up proposal at the longest length) and weighs plain decoding from its
    first step (no MIN_EVIDENCE drafting steps again), probing from PROBE_EVERY on its own text;
    what the new run learns stays its own until it is kept."""
    memory, first = GammaMemory(), CostAwareGamma(4)
    _run(first, 40, accept=0.0, draft_s=0.3, verify_s=_linear(1.0, 0.1))
    assert first.next() == 0 and first.interval > PROBE_EVERY  # plain wins, probes grew rare
    memory.keep("draft A", "", first)
    second = memory.chooser("draft A", "", 4)
    assert second is not first and not second.recent_caps and second.probed_from is None
    assert second.interval == PROBE_EVERY and second.drafting_steps >= MIN_EVIDENCE
    picks = _run(second, PROBE_EVERY + 1, accept=0.0, draft_s=0.3, verify_s=_linear(1.0, 0.1))
    # one token drafted (the carried acceptance weighs a quarter: the old text's zeros weigh
    # little), then plain at once, where a fresh chooser drafts MIN_EVIDENCE steps
    assert picks == [1] + [0] * PROBE_EVERY
    second.observe(2, 2, 2, 0.02, 1.02)
    kept = memory.chooser("draft A", "", 4)  # the kept one is unchanged
    assert ((kept.draft_s, kept.verify_s) == (first.draft_s, first.verify_s)
            != (second.draft_s, second.verify_s))
    for other in (memory.chooser("draft B", "", 4), memory.chooser("draft A", "lookup", 4),
                  # another draft, route or longest proposal: from scratch
                  memory.chooser("draft A", "", 3)):
        assert other.draft_s is None and other.next() == other.max_gamma
    for i in range(MAX_KEPT):  # bounded: the least recently kept go first
        memory.keep(f"draft {i}", "", CostAwareGamma(4))
    assert memory.chooser("draft A", "", 4).draft_s is None and len(memory._kept) == MAX_KEPT


def test_a_run_on_text_the_draft_suits_soon_outweighs_the_last_runs_acceptance():
    """Costs carry over in full, acceptance at a quarter of its weight: after a run on text the
    draft seldom got past its first token, a run on text it predicts well drafts the longest
    proposals almost at once. Carried in full, that run's rates held the next one shorter for many
    steps (caps of 4 in 7 to 28 of 30 steps over ten seeds)."""
    for seed in range(3):
        memory, first = GammaMemory(), CostAwareGamma(4)
        _run(first, 60, accept=0.3, draft_s=0.02, verify_s=_linear(1.0, 0.05), seed=seed)
        memory.keep("draft", "", first)
        second = memory.chooser("draft", "", 4)
        assert second.draft_s == first.draft_s and second.verify_s == first.verify_s
        picks = _run(second, 30, accept=0.95, draft_s=0.02, verify_s=_linear(1.0, 0.05),
                     seed=100 + seed)
        assert picks.count(4) >= 26


def test_generate_keeps_auto_s_estimates_per_target_draft_and_threads():
    """`generate` with gamma auto keeps its choosers in the caller's memory of the target under the
    draft and the thread count: the next run with the same draft starts from them, another thread
    count afresh, and a run given no memory afresh too."""
    base = tiny_model(scale=3.0, hidden=64)
    target, draft = at(base, "fp32", fast=True), at(perturbed(base, 0.5), "fp32", fast=True)
    memory = GammaMemory()
    generate(target, [4, 9, 2], draft, gamma="auto", max_new_tokens=30, gamma_memory=memory)
    threads = f"threads={torch.get_num_threads()}"
    [(_, kept)] = [(k, c) for k, c in memory._kept.items() if threads in k[0]]
    assert kept.drafting_steps >= MIN_EVIDENCE
    alone = api.start(target, [4, 9, 2], draft, gamma="auto", max_new_tokens=30)
    alone.prefill()
    with torch.inference_mode():
        alone.propose()
    assert alone.chooser.draft_s is None
    again = api.start(target, [4, 9, 2], draft, gamma="auto", max_new_tokens=30,
                      gamma_memory=memory)
    again.prefill()
    with torch.inference_mode():
        again.propose()
    assert again.chooser.draft_s == kept.draft_s
    assert again.chooser.allowed == [CARRIED_ACCEPTANCE * a for a in kept.allowed]
    assert again.chooser is not kept
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        other = api.start(target, [4, 9, 2], draft, gamma="auto", max_new_tokens=30,
                          gamma_memory=memory)
        other.prefill()
        with torch.inference_mode():
            other.propose()
        assert other.chooser.draft_s is None
    finally:
        torch.set_num_threads(threads)


def test_the_verify_table_follows_the_recent_load():
    """Timings from a slower period fade: the table tracks what steps cost now."""
    chooser = CostAwareGamma(4)
    for i in range(90):
        k = i % 3
        chooser.observe(k, k, 0, 0.01 * k, (3.0 if i < 30 else 1.0) + 0.1 * k)
    assert chooser.verify_cost(1) == pytest.approx(1.0, abs=0.05)  # the slow period: 3.0
    assert chooser.verify_cost(3) == pytest.approx(1.2, abs=0.05)


def test_a_stall_does_not_price_its_row_count_out():
    """A shared VM stalls now and then: one pass timed at ten times its cost. Counted in full, it
    priced the longest proposal out, and a cap not chosen is not timed again but by rare probes."""
    chooser = CostAwareGamma(2)
    flat = _linear(1.0, 0.05)
    _run(chooser, 30, accept=0.8, draft_s=0.02, verify_s=flat)
    assert _best(chooser) == 2
    chooser.observe(2, 2, 2, 0.04, 10 * flat(3))
    picks = _run(chooser, 30, accept=0.8, draft_s=0.02, verify_s=flat, seed=1)
    assert picks.count(2) >= 27


def test_a_row_count_costs_at_most_what_more_rows_were_timed_at():
    chooser = CostAwareGamma(4)
    chooser.verify_s = {1: 1.0, 2: 1.05, 3: 5.0, 5: 1.2}  # 3 rows timed in a stall, never again
    assert [chooser.verify_cost(n) for n in (1, 2, 3, 4, 5)] == [1.0, 1.05, 1.2, 1.2, 1.2]
    assert chooser.verify_cost(2.5) == pytest.approx(1.125)


class _Writes(dict):
    """A verify-cost table that counts its writes."""

    writes = 0

    def __setitem__(self, key, value):
        self.writes += 1
        super().__setitem__(key, value)


def test_every_route_of_a_run_prices_verify_rows_from_one_table(monkeypatch):
    """ngram+MODEL: the lookup's and the model's choosers price rows from the run's one table (a
    pass costs what its rows cost, whichever route drafted them), and each pass is timed into it
    once, plain steps that every route observes included. Drafting is scripted dear (ten one-row
    passes a token), so plain steps come while the lookup matches too."""
    from specq.core.decode import run
    from specq.drafters import NgramDraft

    observe = CostAwareGamma.observe
    monkeypatch.setattr(CostAwareGamma, "observe",
                        lambda self, cap, drafted, accepted, draft_s, verify_s, nodes=None:
                        observe(self, cap, drafted, accepted, 10.0 * drafted,
                                None if verify_s is None else 1 + drafted / 20, nodes))
    target = tiny_model(scale=3.0, seed=4)
    draft = NgramDraft(k=6, copy=0, fallback=perturbed(target, 0.3, seed=2))
    plain_with_both = 0
    for prompt in ([3, 4, 5, 6, 7, 3, 4, 5, 6, 7, 3, 4], [9, 1, 9, 2, 9, 1, 9, 2, 9]):
        sequence = api.start(target, prompt, draft, gamma="auto", max_new_tokens=60)
        sequence.verify_s = table = _Writes()
        record = sequence.accept

        def accept(logits, features, verify_s, sequence=sequence, record=record):
            nonlocal plain_with_both
            plain_with_both += bool(sequence.asked) and not len(sequence.proposal.tokens)
            record(logits, features, verify_s)
        sequence.accept = accept
        run(sequence)
        assert set(sequence.choosers) == {"lookup", "model"}
        assert all(c.verify_s is table for c in sequence.choosers.values())
        assert table.writes == sequence.stats.steps  # one timing per pass
        assert {1, 7} <= set(table)  # plain steps and the lookup's longest proposals
    assert plain_with_both > 0


def test_parse():
    assert parse("auto") == (AUTO_MAX_GAMMA, True)
    assert parse(3) == (3, False) and parse("3") == (3, False)
    with pytest.raises(SpecqError, match="whole number or 'auto'"):
        parse("many")


@pytest.fixture()
def scripted(monkeypatch):
    """Replace the loop's chooser with one driven by outcomes, the hardest kind of schedule for
    losslessness: 1 to start, then 0 (plain) after a rejection and 2 after a plain step or a fully
    accepted proposal. Yields the list of [chosen g, drafted, accepted] per step."""
    steps = []

    class Chooser:
        def __init__(self, max_gamma):
            self.max_gamma = max_gamma
            self.verify_s = {}

        def next(self):
            g = 1 if not steps else 0 if steps[-1][2] < steps[-1][1] else min(2, self.max_gamma)
            steps.append([g, None, None])
            return g

        def observe(self, cap, drafted, accepted, draft_s, verify_s, nodes=None):
            pass

    record_step = DecodeStats.record_step

    def record(self, drafted, accepted, depth=None, route="draft"):
        if steps and steps[-1][1] is None:  # a step the chooser chose (plain runs have none)
            steps[-1][1:] = [drafted, accepted]
        record_step(self, drafted, accepted, depth, route)

    monkeypatch.setattr(GammaMemory, "chooser",
                        lambda self, key, route, max_gamma: Chooser(max_gamma))
    monkeypatch.setattr(DecodeStats, "record_step", record)
    return steps


@pytest.mark.parametrize("kind", ["sequence", "feature"])
def test_greedy_equality_under_outcome_driven_schedules(scripted, kind):
    target = tiny_model(vocab=32, scale=3.0, seed=4)
    draft = perturbed(target, 0.1) if kind == "sequence" else _feature_model(target)
    for prompt in PROMPTS:
        base = generate(target, prompt, None, max_new_tokens=40)
        scripted.clear()
        spec = generate(target, prompt, draft, gamma="auto", max_new_tokens=40)
        assert spec.token_ids == base.token_ids
        assert {g for g, _, _ in scripted} == {0, 1, 2}  # plain steps and both lengths ran


@pytest.mark.parametrize("kind", ["sequence", "feature"])
def test_auto_is_lossless_end_to_end(kind):
    target = tiny_model(vocab=32, scale=3.0, seed=4)
    draft = perturbed(target, 0.1) if kind == "sequence" else _feature_model(target)
    for prompt in PROMPTS:
        base = generate(target, prompt, None, max_new_tokens=40)
        spec = generate(target, prompt, draft, gamma="auto", max_new_tokens=40)
        assert spec.token_ids == base.token_ids and spec.stats.gamma == AUTO_MAX_GAMMA


def test_sampling_distribution_under_outcome_driven_schedules(scripted):
    """Choosing g from past outcomes keeps speculative sampling exact: 4 sampled tokens against
    the target's computed joint distribution (chi-square, deterministic seeds)."""
    
    cfg = SamplingConfig(temperature=1.0)
    prompt = [1, 2]
    target = tiny_model(vocab=3, hidden=16, scale=1.0, seed=11)
    draft = tiny_model(vocab=3, hidden=16, scale=1.5, seed=12)
    exact = _exact_sequence_distribution(target, prompt, 4, cfg)
    runs, counts, plain = 1500, dict.fromkeys(exact, 0), 0
    for seed in range(runs):
        scripted.clear()
        out = generate(target, prompt, draft, gamma="auto", max_new_tokens=4,
                       temperature=cfg.temperature, seed=seed, draft_confidence=0.0)
        counts[tuple(out.token_ids)] += 1
        plain += scripted[1][0] == 0 if len(scripted) > 1 else 0
    # the second step's length really followed the first's outcome
    assert runs // 5 < plain < runs * 4 // 5
    assert chi_square_p(counts, exact, runs) > 0.001


def test_the_default_is_auto_when_greedy_and_fixed_when_sampling_or_with_a_tree():
    """No gamma given: greedy runs choose each step's length (their output is the target's whatever
    the schedule); sampled runs keep gamma 2, so a seed repeats its output (auto's schedule follows
    timings, and the tokens a seed draws follow the schedule); a tree keeps its depth."""
    from specq.drafters import TreeShape
    from specq.drafters.base import SAMPLING_GAMMA

    base = tiny_model(scale=3.0, hidden=64)
    target, draft = at(base, "fp32", fast=True), at(perturbed(base, 0.5), "fp32", fast=True)
    greedy = api.start(target, [4, 9, 2], draft, max_new_tokens=8)
    sampled = api.start(target, [4, 9, 2], draft, max_new_tokens=8, temperature=0.8, seed=3)
    tree = api.start(target, [4, 9, 2], draft, max_new_tokens=8, tree=TreeShape(8, 3, 2))
    assert (greedy.adaptive, greedy.gamma) == (True, AUTO_MAX_GAMMA)
    assert (sampled.adaptive, sampled.gamma) == (False, SAMPLING_GAMMA)
    assert (tree.adaptive, tree.gamma) == (False, 3)
    runs = [generate(target, [4, 9, 2], draft, max_new_tokens=24, temperature=0.8, seed=3).token_ids
            for _ in range(2)]
    assert runs[0] == runs[1]


def test_a_tree_drafters_rows_are_priced_per_node_not_per_level():
    """Steps that verify three nodes per level (a tree, lookahead's window and n-grams): four
    accepted levels for a 13-row pass ten times a plain step's cost lose to plain decoding.
    Priced by depth alone (5 rows, interpolated) they would look 2.5 times faster than plain."""
    chooser = CostAwareGamma(4)
    for _ in range(MIN_EVIDENCE + 2):
        chooser.observe(4, 4, 4, 0.0, 1.0, nodes=12)
        chooser.observe(0, 0, 0, 0.0, 0.1)
    assert chooser.width == pytest.approx(3.0, abs=0.3)
    assert chooser.tokens_per_second(4) < chooser.tokens_per_second(0)
    assert chooser.next() == 0
