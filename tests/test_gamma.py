"""gamma "auto": the cost-aware choice, and losslessness under any per-step schedule."""

import pytest
import torch

from specq import decode as decode_module
from specq import generate
from specq.errors import SpecqError
from specq.gamma import AUTO_MAX_GAMMA, PROBE_EVERY, CostAwareGamma, parse
from specq.sampling import SamplingConfig
from specq.stats import DecodeStats

from conftest import perturbed, tiny_model
from test_decode import PROMPTS, _exact_sequence_distribution
from test_feature_draft import _feature_model


def _measured(accept: float, base_s: float, per_token_s: float, steps: int = 20) -> tuple:
    """A chooser and stats after `steps` steps of random lengths at the given acceptance and costs."""
    rng = torch.Generator().manual_seed(0)
    chooser, stats = CostAwareGamma(4), DecodeStats(gamma=4)
    for _ in range(steps):
        k = int(torch.randint(0, 5, (1,), generator=rng))
        n = 0
        while n < k and torch.rand(1, generator=rng).item() < accept:
            n += 1
        stats.record_step(k, n)
        chooser.observe(k, base_s + per_token_s * k)
    return chooser, stats


def test_first_a_plain_step_then_a_full_proposal():
    chooser, stats = CostAwareGamma(3), DecodeStats(gamma=3)
    assert chooser.next(stats) == 0
    chooser.observe(0, 1.0)
    assert chooser.next(stats) == 3
    chooser.observe(3, 1.6)
    assert chooser.cost_line() == pytest.approx((1.0, 0.2))


def test_plain_decoding_when_the_draft_does_not_pay_with_probes():
    chooser, stats = _measured(accept=0.1, base_s=1.0, per_token_s=0.3)
    picks = []
    for _ in range(3 * (PROBE_EVERY + 1)):
        picks.append(chooser.next(stats))
        chooser.observe(picks[-1], 1.0 + 0.3 * picks[-1])
        stats.record_step(picks[-1], 0)
    assert picks.count(1) == 3 and set(picks) == {0, 1}  # a one-token probe after PROBE_EVERY plain steps


def test_long_proposals_when_the_draft_agrees_and_is_cheap():
    chooser, stats = _measured(accept=0.95, base_s=1.0, per_token_s=0.02)
    assert chooser.next(stats) == 4


def test_costlier_drafts_get_shorter_proposals():
    cheap = _measured(accept=0.6, base_s=1.0, per_token_s=0.02)
    costly = _measured(accept=0.6, base_s=1.0, per_token_s=0.25)
    assert 0 < costly[0].next(costly[1]) < cheap[0].next(cheap[1])


def test_the_cost_line_follows_the_recent_load():
    """Timings from a slower period fade: the line tracks what steps cost now."""
    chooser = CostAwareGamma(4)
    for i in range(90):
        k = i % 3
        chooser.observe(k, (3.0 if i < 30 else 1.0) + 0.1 * k)
    base, per_token = chooser.cost_line()
    assert base == pytest.approx(1.0, abs=0.15) and per_token == pytest.approx(0.1, abs=0.05)  # the slow period: 3.0


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

        def next(self, stats):
            g = 1 if not steps else 0 if steps[-1][2] < steps[-1][1] else min(2, self.max_gamma)
            steps.append([g, None, None])
            return g

        def observe(self, rows, verify_s):
            pass

    record_step = DecodeStats.record_step

    def record(self, drafted, accepted):
        if steps and steps[-1][1] is None:  # a step the chooser chose (plain runs have none)
            steps[-1][1:] = [drafted, accepted]
        record_step(self, drafted, accepted)

    monkeypatch.setattr(decode_module, "CostAwareGamma", Chooser)
    monkeypatch.setattr(DecodeStats, "record_step", record)
    return steps


@pytest.mark.parametrize("kind", ["sequence", "feature"])
def test_greedy_equality_under_outcome_driven_schedules(scripted, kind):
    target = tiny_model(vocab=32, scale=3.0, seed=4)
    draft = perturbed(target, 0.1) if kind == "sequence" else _feature_model(target)
    for prompt in PROMPTS:
        base = generate(target, prompt, max_new_tokens=40)
        scripted.clear()
        spec = generate(target, prompt, draft, gamma="auto", max_new_tokens=40)
        assert spec.token_ids == base.token_ids
        assert {g for g, _, _ in scripted} == {0, 1, 2}  # plain steps and both lengths ran


@pytest.mark.parametrize("kind", ["sequence", "feature"])
def test_auto_is_lossless_end_to_end(kind):
    target = tiny_model(vocab=32, scale=3.0, seed=4)
    draft = perturbed(target, 0.1) if kind == "sequence" else _feature_model(target)
    for prompt in PROMPTS:
        base = generate(target, prompt, max_new_tokens=40)
        spec = generate(target, prompt, draft, gamma="auto", max_new_tokens=40)
        assert spec.token_ids == base.token_ids and spec.stats.gamma == AUTO_MAX_GAMMA


def test_sampling_distribution_under_outcome_driven_schedules(scripted):
    """Choosing g from past outcomes keeps speculative sampling exact: 4 sampled tokens against
    the target's computed joint distribution (chi-square, deterministic seeds)."""
    from scipy.stats import chisquare

    cfg = SamplingConfig(temperature=1.0)
    prompt = [1, 2]
    target = tiny_model(vocab=3, hidden=16, scale=1.0, seed=11)
    draft = tiny_model(vocab=3, hidden=16, scale=1.5, seed=12)
    exact = _exact_sequence_distribution(target, prompt, 4, cfg)
    runs, counts, plain = 1500, dict.fromkeys(exact, 0), 0
    for seed in range(runs):
        scripted.clear()
        out = generate(target, prompt, draft, gamma="auto", max_new_tokens=4, temperature=cfg.temperature,
                       seed=seed, draft_confidence=0.0)
        counts[tuple(out.token_ids)] += 1
        plain += scripted[1][0] == 0 if len(scripted) > 1 else 0
    assert runs // 5 < plain < runs * 4 // 5  # the second step's length really followed the first's outcome
    cells = [(counts[k], exact[k] * runs) for k in exact]
    big = [(c, e) for c, e in cells if e >= 5]
    small = [(c, e) for c, e in cells if 0 < e < 5]
    observed = [c for c, _ in big] + ([sum(c for c, _ in small)] if small else [])
    expected = [e for _, e in big] + ([sum(e for _, e in small)] if small else [])
    scale = sum(observed) / sum(expected)
    assert chisquare(observed, [e * scale for e in expected]).pvalue > 0.001
