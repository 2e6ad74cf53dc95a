"""The acceptance kernel is exact: computed, not sampled."""

import pytest
import torch

from specq.core.acceptance import accept_greedy, accept_sampling, chain_parents
from specq.core.sampling import (SamplingConfig, acceptance_probability, probabilities, residual,
                                 sample)


def _output_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """What the kernel emits for one drafted position, from its own parts:
    x ~ q kept with probability a(x), else a replacement from the residual."""
    keep = q * acceptance_probability(p, q)
    return keep + (1 - keep.sum()) * residual(p, q)


@pytest.mark.parametrize("seed", range(20))
def test_kernel_yields_target_distribution(seed):
    g = torch.Generator().manual_seed(seed)
    v = 2 + seed
    p = torch.rand(v, generator=g, dtype=torch.float64) ** 3
    q = torch.rand(v, generator=g, dtype=torch.float64) ** 3
    if seed % 4 == 0:  # disjoint supports and exact zeros
        p[: v // 2] = 0
        q[v // 2:] = 0
    p, q = p / p.sum(), q / q.sum()
    torch.testing.assert_close(_output_distribution(p, q), p, atol=1e-12, rtol=0)


def test_kernel_identical_distributions_accept_everything():
    p = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)
    assert torch.all(acceptance_probability(p, p) == 1)
    torch.testing.assert_close(_output_distribution(p, p), p)


def test_expected_acceptance_is_one_minus_tv():
    g = torch.Generator().manual_seed(0)
    p = torch.rand(50, generator=g, dtype=torch.float64); p /= p.sum()
    q = torch.rand(50, generator=g, dtype=torch.float64); q /= q.sum()
    accept = (q * acceptance_probability(p, q)).sum()
    torch.testing.assert_close(accept, 1 - 0.5 * (p - q).abs().sum())


def test_greedy_chain():
    logits = torch.full((4, 10), -1.0)
    for row, best in enumerate([3, 5, 7, 2]):
        logits[row, best] = 1.0
    def accepted(tokens, rows):
        path, nxt = accept_greedy(torch.tensor(tokens, dtype=torch.long),
                                  chain_parents(len(tokens)), rows)
        return len(path), nxt

    assert accepted([3, 5, 7], logits) == (3, 2)  # all accepted, bonus
    assert accepted([3, 9, 7], logits) == (1, 5)  # mismatch at 2nd
    assert accepted([0, 5, 7], logits) == (0, 3)
    assert accepted([], logits[:1]) == (0, 3)


def test_sampling_rejects_impossible_tokens():
    p = torch.tensor([[0.0, 1.0, 0.0], [0.2, 0.3, 0.5]])
    q = torch.tensor([[1.0, 0.0, 0.0]])
    path, nxt = accept_sampling(torch.tensor([0]), chain_parents(1), q, p,
                                torch.Generator().manual_seed(0))
    assert (path, nxt) == ([], 1)


def test_processing_temperature_topk_topp():
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0]])
    plain = probabilities(logits, SamplingConfig(temperature=1.0))
    torch.testing.assert_close(plain, logits.softmax(-1))
    hot = probabilities(logits, SamplingConfig(temperature=2.0))
    torch.testing.assert_close(hot, (logits / 2).softmax(-1))
    top2 = probabilities(logits, SamplingConfig(temperature=1.0, top_k=2))
    assert (top2[0, 2:] == 0).all() and torch.isclose(top2.sum(), torch.tensor(1.0))
    # top-p keeps the smallest prefix whose mass reaches p (here the first two tokens: 0.59 + 0.22)
    top_p = probabilities(logits, SamplingConfig(temperature=1.0, top_p=0.7))
    assert (top_p[0, :2] > 0).all() and (top_p[0, 2:] == 0).all()
    tiny_p = probabilities(logits, SamplingConfig(temperature=1.0, top_p=0.01))
    assert tiny_p[0, 0] == 1.0


@pytest.mark.parametrize("bad",
                         [dict(temperature=-1), dict(top_k=-1), dict(top_p=0), dict(top_p=1.5)])
def test_bad_sampling_config(bad):
    with pytest.raises(ValueError):
        SamplingConfig(**bad)


def test_sample_draws_each_rows_distribution_and_never_a_zero(monkeypatch):
    """`sample` inverts each row's cumulative sum: over many draws the frequencies match the row
    (chi-square), a token of probability 0 never comes up, and a draw at the very top of a row
    (u * total rounded up to total) takes the last token that has mass."""
    from scipy.stats import chisquare

    g = torch.Generator().manual_seed(0)
    p = torch.tensor([[0.0, 0.5, 0.0, 0.2, 0.3, 0.0], [0.1, 0.0, 0.6, 0.0, 0.0, 0.3]])
    n = 20000
    draws = torch.stack([sample(p, g) for _ in range(n)])  # [n, 2]
    for row in range(2):
        counts = torch.bincount(draws[:, row], minlength=6).double()
        assert counts[p[row] == 0].sum() == 0
        mass = p[row] > 0
        expected = p[row][mass].double()
        assert chisquare(counts[mass], n * expected / expected.sum()).pvalue > 1e-3
    assert sample(p[0], g).dim() == 0  # one row: one token, as multinomial's squeezed one
    monkeypatch.setattr(torch, "rand", lambda shape, **kw: torch.ones(shape, dtype=kw["dtype"]))
    assert sample(p, g).tolist() == [4, 5]
