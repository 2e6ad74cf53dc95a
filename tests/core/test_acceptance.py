"""Tree acceptance: greedy follows the target's argmax, sampling emits what
the target alone would."""

import bisect
import itertools
import random

import pytest
import torch
from scipy.stats import chisquare
from torch import Tensor

from specq.core import acceptance
from specq.core.acceptance import (accept_greedy, accept_sampling, chain_parents, depths, is_chain,
                                   tree_mask)
from specq.core.sampling import acceptance_probability, residual, sample

V = 4  # small, so each of the V ** LENGTH emitted sequences is expected often enough to test
LENGTH = 3  # emitted tokens compared: one more than the trees below are deep


def _one_hot_logits(best: list[int], v: int = 10) -> torch.Tensor:
    logits = torch.zeros(len(best), v)
    logits[torch.arange(len(best)), torch.tensor(best)] = 1.0
    return logits


# ----- tree helpers


def test_depths():
    assert depths(torch.tensor([-1, -1, 0, 1, 1, 3])).tolist() == [1, 1, 2, 2, 2, 3]
    assert depths(chain_parents(4)).tolist() == [1, 2, 3, 4]
    assert depths(chain_parents(0)).tolist() == []


def test_tree_mask():
    expected = torch.tensor([[1, 0, 0, 0],   # root
                             [1, 1, 0, 0],   # node 0 under the root
                             [1, 1, 1, 0],   # node 1 under node 0
                             [1, 0, 0, 1]],  # node 2 under the root
                            dtype=torch.bool)
    assert torch.equal(tree_mask(torch.tensor([-1, 0, -1])), expected)
    assert torch.equal(tree_mask(chain_parents(5)), torch.ones(6, 6, dtype=torch.bool).tril())
    assert torch.equal(tree_mask(chain_parents(0)), torch.ones(1, 1, dtype=torch.bool))


def test_chain_parents_and_is_chain():
    assert chain_parents(3).tolist() == [-1, 0, 1]
    assert chain_parents(0).shape == (0,)
    assert is_chain(chain_parents(4)) and is_chain(chain_parents(0))
    assert not is_chain(torch.tensor([-1, -1]))
    assert not is_chain(torch.tensor([-1, 0, 0]))


@pytest.mark.parametrize("parents", [[0], [-2], [-1, 2, 0], [-1, 1]])
def test_parents_out_of_topological_order(parents):
    with pytest.raises(ValueError):
        depths(torch.tensor(parents))
    with pytest.raises(ValueError):
        accept_greedy(torch.zeros(len(parents), dtype=torch.long), torch.tensor(parents),
                      torch.zeros(len(parents) + 1, 10))


# ----- greedy

# root -> node 0 (token 5) -> node 2 (token 7)
#      -> node 1 (token 6) -> node 3 (token 8) -> node 5 (token 2)
#                          -> node 4 (token 9)
TOKENS = torch.tensor([5, 6, 7, 8, 9, 2])
PARENTS = torch.tensor([-1, -1, 0, 1, 1, 3])


def test_greedy_takes_second_siblings():
    # argmax per row (row 0 = root, row i + 1 = node i): 6 at the root (node 1, the second
    # child), 9 at node 1 (node 4, its second child), 3 at node 4 (a leaf: the next token)
    best = [6, 0, 9, 0, 0, 3, 0]
    assert accept_greedy(TOKENS, PARENTS, _one_hot_logits(best)) == ([1, 4], 3)


def test_greedy_no_child_matches():
    assert accept_greedy(TOKENS, PARENTS, _one_hot_logits([4, 5, 6, 7, 8, 9, 1])) == ([], 4)
    # node 2's token (7) is node 0's row's argmax, but node 0 was not accepted
    assert accept_greedy(TOKENS, PARENTS, _one_hot_logits([6, 7, 1, 0, 0, 0, 0])) == ([1], 1)


def test_greedy_full_path_to_a_leaf():
    best = [6, 0, 8, 0, 2, 0, 4]  # nodes 1, 3, 5 (a leaf), whose row gives the next token
    assert accept_greedy(TOKENS, PARENTS, _one_hot_logits(best)) == ([1, 3, 5], 4)
    assert accept_greedy(TOKENS, PARENTS, _one_hot_logits([5, 7, 0, 3, 0, 0, 0])) == ([0, 2], 3)


def test_greedy_empty_tree():
    empty = torch.empty(0, dtype=torch.long)
    assert accept_greedy(empty, empty, _one_hot_logits([3])) == ([], 3)


def test_greedy_chain_matches_verify_greedy():
    g = torch.Generator().manual_seed(0)
    for trial in range(300):
        n = trial % 7
        logits = torch.randint(0, 3, (n + 1, 5), generator=g).float()  # ties, broken alike
        drafted = logits[:n].argmax(-1)
        wrong = torch.rand(n, generator=g) < 0.3
        drafted = torch.where(wrong, torch.randint(0, 5, (n,), generator=g), drafted)
        path, nxt = accept_greedy(drafted, chain_parents(n), logits)
        assert path == list(range(len(path)))
        assert (len(path), nxt) == verify_greedy(drafted, logits)


# ----- sampling: the chain case is the chain kernel, draw for draw


def test_sampling_chain_matches_verify_sampling_draw_for_draw():
    data = torch.Generator().manual_seed(1)
    for trial in range(300):
        n, v = trial % 6, 6
        p = torch.rand(n + 1, v, generator=data) ** 3
        q = torch.rand(n, v, generator=data) ** 3
        if trial % 3 == 0:  # zeros in either, not both at a drafted token
            p[:, : v // 2] = 0
            q[:, v - 1] = 0
        p, q = p / p.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True)
        drafted = (torch.multinomial(q, 1, generator=data).squeeze(-1) if n
                   else torch.zeros(0, dtype=torch.long))
        mine, theirs = torch.Generator().manual_seed(trial), torch.Generator().manual_seed(trial)
        path, nxt = accept_sampling(drafted, chain_parents(n), q, p, mine)
        assert (len(path), nxt) == verify_sampling(drafted, q, p, theirs)
        assert path == list(range(len(path)))
        assert torch.equal(mine.get_state(), theirs.get_state())


# ----- sampling: corner cases


def test_sampling_never_accepts_a_token_the_target_cannot_emit():
    p = torch.tensor([[0.0, 1.0, 0.0], [0.2, 0.3, 0.5]])
    for q in (torch.tensor([[0.0, 1.0, 0.0]]), None):  # q_x(x) = 0 too, and a point mass
        for seed in range(20):
            assert accept_sampling(torch.tensor([2]), chain_parents(1), q, p,
                                   torch.Generator().manual_seed(seed)) == ([], 1)


def test_sampling_accepts_a_token_the_draft_gave_zero():
    p = torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.0, 1.0]])
    q = torch.tensor([[1.0, 0.0, 0.0]])
    for seed in range(20):
        assert accept_sampling(torch.tensor([1]), chain_parents(1), q, p,
                               torch.Generator().manual_seed(seed)) == ([0], 2)


def test_sampling_empty_residual_falls_back_to_the_target():
    p = torch.tensor([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]])
    q = torch.tensor([[0.5, 0.5, 0.0]])  # r == q, so max(0, r - q) is all zero
    emitted = {accept_sampling(torch.tensor([2]), chain_parents(1), q, p,
                               torch.Generator().manual_seed(seed))[1] for seed in range(50)}
    assert emitted == {0, 1}


def test_sampling_duplicate_deterministic_siblings():
    p = torch.tensor([[0.5, 0.5], [0.5, 0.5], [0.5, 0.5]])
    outcomes = {tuple(accept_sampling(torch.tensor([1, 1]), torch.tensor([-1, -1]), None, p,
                                      torch.Generator().manual_seed(seed))[0])
                for seed in range(100)}
    assert outcomes == {(), (0,)}  # once 1 is rejected the target has no mass left for its twin


# ----- sampling: the emitted tokens follow the target alone
#
# Every distribution is a function of the token prefix, as a real model's is, so rows agree wherever
# prefixes agree (repeated siblings included). The kernel's output (accepted tokens + next token) is
# completed to LENGTH tokens by the target alone, as the next decoding steps would, and compared
# with the target's own distribution over LENGTH tokens, computed exactly.


def _index(prefix) -> int:
    out = 0
    for token in prefix:
        out = out * (V + 1) + token + 1
    return out


def _tables(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """p and q [prefixes, V] for every prefix shorter than LENGTH; p gives one token 0 probability
    in some rows (a top-k target), q never does, so drafts the target cannot emit occur."""
    g = torch.Generator().manual_seed(seed)
    rows = (V + 1) ** (LENGTH - 1)
    p = torch.randn(rows, V, generator=g).softmax(-1)
    p[torch.arange(0, rows, 3), torch.randint(0, V, (len(range(0, rows, 3)),), generator=g)] = 0
    p = p / p.sum(-1, keepdim=True)
    q = (p.clamp(min=0.05).log() + 1.2 * torch.randn(rows, V, generator=g)).softmax(-1)
    return p, q


def _target_distribution(p: torch.Tensor, length: int) -> dict[tuple, float]:
    out = {}
    for seq in itertools.product(range(V), repeat=length):
        prob = 1.0
        for j in range(length):
            prob *= float(p[_index(seq[:j]), seq[j]])
        out[seq] = prob
    return out


def _draft(parents: list[int], q_table: torch.Tensor, sampled: bool, draws: int, seed: int):
    """tokens [draws, N] and the prefix index of each node [draws, N]. Sampled: each node drawn
    from q of its parent's prefix (siblings i.i.d.). Otherwise the top children of that q, as
    a deterministic tree (the same every draw)."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.zeros(draws, len(parents), dtype=torch.long)
    index = torch.zeros(draws, len(parents), dtype=torch.long)
    for node, parent in enumerate(parents):
        parent_index = index[:, parent] if parent >= 0 else torch.zeros(draws, dtype=torch.long)
        if sampled:
            tokens[:, node] = torch.multinomial(q_table[parent_index], 1, generator=g).squeeze(-1)
        else:
            rank = sum(1 for sibling in parents[:node] if sibling == parent)
            ranked = q_table[parent_index].sort(dim=-1, descending=True, stable=True).indices
            tokens[:, node] = ranked[:, rank]
        index[:, node] = parent_index * (V + 1) + tokens[:, node] + 1
    return tokens, index


def _run(parents: list[int], sampled: bool, draws: int, seed: int, parent_rows: bool = False):
    """Sample the kernel; returns (emitted sequences completed to LENGTH, acceptances by path
    length, paths through a sibling other than the first). `parent_rows` hands each node its
    parent's target row, as an off-by-one in the row indexing would."""
    p_table, q_table = _tables(seed)
    tokens, index = _draft(parents, q_table, sampled, draws, seed + 1)
    rows = torch.cat([torch.zeros(draws, 1, dtype=torch.long), index], dim=1)  # [draws, N+1]
    parent_row = [parent + 1 for parent in parents]
    p_rows = p_table[rows[:, [0] + parent_row] if parent_rows else rows]
    q_rows = q_table[rows[:, parent_row]]
    first_child = {pa: parents.index(pa) for pa in set(parents)}
    cumulative = [list(itertools.accumulate(row)) for row in p_table.tolist()]
    completion = random.Random(seed + 2)
    generator = torch.Generator().manual_seed(seed + 3)
    parents_t = torch.tensor(parents)
    seqs, accepted, later_sibling = [], [0] * (max(depths(parents_t).tolist()) + 1), 0
    for d in range(draws):
        q = q_rows[d] if sampled else None
        path, nxt = accept_sampling(tokens[d], parents_t, q, p_rows[d], generator)
        accepted[len(path)] += 1
        later_sibling += any(first_child[parents[node]] != node for node in path)
        seq = tokens[d, path].tolist() + [nxt]
        while len(seq) < LENGTH:
            cdf = cumulative[_index(seq)]
            seq.append(min(bisect.bisect(cdf, completion.random() * cdf[-1]), V - 1))
        seqs.append(tuple(seq[:LENGTH]))
    return seqs, accepted, later_sibling


def _p_values(seqs: list[tuple], p_table: torch.Tensor) -> list[float]:
    """Chi-square p-value of the emitted sequences' first 1, 2, ... LENGTH tokens against the
    target's distribution (cells expected fewer than 5 times pooled into one; 0 when a sequence
    the target gives probability 0 was emitted)."""
    out = []
    for length in range(1, LENGTH + 1):
        expected = _target_distribution(p_table, length)
        observed = {seq: 0 for seq in expected}
        for seq in seqs:
            observed[seq[:length]] += 1
        if any(observed[seq] for seq, prob in expected.items() if prob == 0):
            out.append(0.0)  # emitted what the target never would
            continue
        big = [seq for seq, prob in expected.items() if prob * len(seqs) >= 5]
        small = [seq for seq, prob in expected.items() if 0 < prob * len(seqs) < 5]
        f_obs = [observed[s] for s in big] + ([sum(observed[s] for s in small)] if small else [])
        f_exp = [expected[s] for s in big] + ([sum(expected[s] for s in small)] if small else [])
        total = sum(f_exp)
        out.append(float(chisquare(f_obs, [len(seqs) * f / total for f in f_exp]).pvalue))
    return out


TREES = {  # name: (parents, siblings sampled i.i.d. from q rather than fixed top children)
    "top-children": ([-1, -1, 0, 0, 1], False),
    "iid-siblings": ([-1, -1, 0, 0, 1, 1], True),
    "chain": ([-1, 0], True),
}


@pytest.mark.parametrize("name", TREES)
def test_sampling_emits_the_target_distribution(name):
    parents, sampled = TREES[name]
    seqs, accepted, later_sibling = _run(parents, sampled, draws=20_000, seed=10)
    assert min(_p_values(seqs, _tables(10)[0])) > 1e-3
    assert all(count > 0 for count in accepted)  # 0, 1 and 2 nodes accepted
    if name != "chain":
        assert later_sibling > 0  # a first sibling rejected, a later one accepted


@pytest.mark.parametrize("name", TREES)
@pytest.mark.parametrize("bug", ["no residual", "parent rows"])
def test_distribution_check_rejects_a_wrong_kernel(name, bug, monkeypatch):
    """The check can fail. No residual: r stays as it was after a rejection, so later siblings
    and the next token reuse mass already rejected. Parent rows: after an acceptance the kernel
    goes on with the parent's distribution, which only the second token and later can show."""
    if bug == "no residual":
        monkeypatch.setattr(acceptance, "residual", lambda r, q: r)
    parents, sampled = TREES[name]
    seqs, _, _ = _run(parents, sampled, draws=3_000, seed=10, parent_rows=bug == "parent rows")
    p_values = _p_values(seqs, _tables(10)[0])
    assert min(p_values) < 1e-6
    if bug == "parent rows":
        assert p_values[0] > 1e-3  # the first token is still right


# ----- the chain kernel as it stood before trees (sampling.py, session 7), kept as an independent
# reference for the chain case


def verify_greedy(draft_tokens: Tensor, target_logits: Tensor) -> tuple[int, int]:
    """draft_tokens [g], target_logits [g+1, V] -> (accepted count, next token)."""
    best = target_logits.argmax(dim=-1)
    g = draft_tokens.shape[0]
    n = int((draft_tokens == best[:g]).int().cumprod(0).sum()) if g else 0
    return n, int(best[n])


def verify_sampling(draft_tokens: Tensor, q: Tensor, p: Tensor,
                    generator: torch.Generator) -> tuple[int, int]:
    """draft_tokens [g] drawn from q [g, V]; target p [g+1, V] -> (accepted count, next token)."""
    g = draft_tokens.shape[0]
    if g:
        rows = torch.arange(g)
        accept_p = acceptance_probability(p[rows, draft_tokens], q[rows, draft_tokens])
        u = torch.rand(g, generator=generator)
        n = int((u < accept_p).int().cumprod(0).sum())
    else:
        n = 0
    if n == g:
        return n, int(sample(p[g], generator))
    return n, int(sample(residual(p[n], q[n]), generator))
