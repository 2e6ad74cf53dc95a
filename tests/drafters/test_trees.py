"""Token trees end to end: the tree forward, dynamic trees from both drafters, lossless decoding."""

import pytest
import torch

from specq import generate
from specq import backends
from specq.core.acceptance import depths, tree_mask
from specq.drafters import TreeShape
from specq.drafters.tree import grow
from specq.loading.kinds import for_pair

from conftest import (_exact_sequence_distribution, _feature_model, chi_square_p, perturbed,
                      tiny_model)

SHAPES = [TreeShape(1, 1, 1), TreeShape(4, 2, 2), TreeShape(8, 3, 3), TreeShape(16, 4, 4),
          TreeShape(64, 6, 8)]


@torch.inference_mode()
def test_a_tree_pass_gives_each_node_the_logits_of_its_own_path():
    """On the fast path every verify row of a tree equals the one-token step at the end of the
    node's own path, bit for bit (each row attends exactly to its path's keys)."""
    target = tiny_model(vocab=32, scale=3.0, seed=4)
    net = backends.runner(target.net, "kernels")
    assert net.kernels
    prompt = torch.tensor([1, 2, 3, 4])
    parents = torch.tensor([-1, -1, 0, 0, 1, 2, -1])
    tokens = torch.tensor([5, 6, 7, 8, 9, 10, 11])
    cache = net.new_cache(32)
    net(prompt[:-1], cache)
    start = cache.length
    positions = start + torch.cat([torch.zeros(1, dtype=torch.long), depths(parents)])
    rows = net(torch.cat([prompt[-1:], tokens]), cache, positions=positions,
               mask=tree_mask(parents))
    for node in range(len(tokens)):
        path, at = [], node
        while at != -1:
            path.insert(0, int(tokens[at]))
            at = int(parents[at])
        steps = net.new_cache(32)
        net(prompt[:-1], steps)
        for token in [int(prompt[-1])] + path:  # one-token steps, as plain decoding runs them
            step = net(torch.tensor([token]), steps)
        assert torch.equal(rows[node + 1], step[0]), node


def test_cache_keep_compacts_the_accepted_path():
    target = tiny_model(vocab=32, seed=4)
    cache = target.net.new_cache(16)
    target.net(torch.arange(8), cache)
    k = cache.k.clone()
    cache.keep(3, torch.tensor([0, 2, 4]))
    assert cache.length == 6
    assert torch.equal(cache.k[:, :, :, 3:6], k[:, :, :, [3, 5, 7]])
    assert torch.equal(cache.k[:, :, :, :3], k[:, :, :, :3])
    with pytest.raises(ValueError):
        cache.keep(3, torch.tensor([0, 9]))


def test_grow_keeps_the_best_nodes_as_a_tree():
    """A fixed draft distribution: children of every node score log(0.5), log(0.3), log(0.2)."""
    logprobs = torch.tensor([0.5, 0.3, 0.2]).log()
    fed = []

    def expand(tokens, parent_rows, node_depths, mask):
        fed.append((tokens.tolist(), parent_rows.tolist(), node_depths.tolist(), mask.clone()))
        return logprobs.expand(len(tokens), -1)

    proposal = grow(logprobs, expand, TreeShape(size=5, depth=3, topk=2))
    # best paths: 0 (.5), 0-0 (.25), 1 (.3), 0-1 (.15), 1-0 (.15); then depth 3's best is .125 < .15
    assert proposal.tokens.tolist() == [0, 1, 0, 1, 0]
    assert proposal.parents.tolist() == [-1, -1, 0, 0, 1]
    assert proposal.probs is None
    # level 2: the two children of the root were fed
    assert fed[0][:3] == ([0, 1], [-1, -1], [1, 1])
    assert fed[1][2] == [2, 2]  # level 3: the two best of the four level-2 nodes
    assert fed[1][3].tolist() == [[True, False, True, False], [True, False, False, True]]


@pytest.mark.parametrize("kind", ["sequence", "feature"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s.size}n-d{s.depth}-k{s.topk}")
def test_greedy_equality_with_trees(kind, shape):
    target = tiny_model(vocab=32, scale=3.0, seed=4)
    draft = perturbed(target, 0.2) if kind == "sequence" else _feature_model(target)
    rejected = accepted_deeper = 0
    for prompt in ([1, 2, 3], [5, 6, 7, 8, 9]):
        base = generate(target, prompt, None, max_new_tokens=30)
        for gamma in (shape.depth, "auto"):
            spec = generate(target, prompt, draft, tree=shape, gamma=gamma, max_new_tokens=30)
            assert spec.token_ids == base.token_ids
            stats = spec.stats
            rejected += stats.drafted - stats.accepted
            accepted_deeper += sum(stats.accepted_at[1:])
    assert rejected > 0
    if shape.depth > 1 and kind == "sequence":
        assert accepted_deeper > 0  # paths past the first level were accepted too


def test_a_tree_accepts_where_the_chain_rejects():
    """The draft's second choice is often right where its first is wrong: with the same draft, a
    tree accepts more tokens per pass than a chain of the same depth."""
    target = tiny_model(vocab=32, scale=3.0, seed=4)
    draft = perturbed(target, 0.5)
    chain = generate(target, [1, 2, 3], draft, gamma=3, max_new_tokens=40, draft_confidence=0.0)
    tree = generate(target, [1, 2, 3], draft, tree=TreeShape(12, 3, 3), max_new_tokens=40)
    assert tree.token_ids == chain.token_ids
    assert tree.stats.tau > chain.stats.tau


@pytest.mark.parametrize("kind", ["sequence", "feature"])
def test_sampling_distribution_with_trees(kind):
    """Seeded sampling with branching trees vs the target's computed joint distribution of the
    first three new tokens: chi-square, deterministic seeds; rejections of a first child happen."""
    prompt = [1, 2]
    target = tiny_model(vocab=5, hidden=16, scale=1.0, seed=11)
    draft = (tiny_model(vocab=5, hidden=16, scale=1.5, seed=12) if kind == "sequence"
             else _feature_model(target, vocab_ids=list(range(5))))
    exact = _exact_sequence_distribution(target, prompt, 3, _sampling(1.0))
    runs, counts, rejected = 2000, dict.fromkeys(exact, 0), 0
    shape = TreeShape(6, 2, 2)
    for seed in range(runs):
        out = generate(target, prompt, draft, tree=shape, max_new_tokens=3, temperature=1.0,
                       seed=seed)
        counts[tuple(out.token_ids)] += 1
        rejected += out.stats.drafted - out.stats.accepted
    assert rejected > runs
    assert chi_square_p(counts, exact, runs) > 0.001


def _sampling(temperature):
    from specq.core.sampling import SamplingConfig

    return SamplingConfig(temperature=temperature)


def test_trees_need_native_llama_models():
    from conftest import tiny_hf_qwen2

    from specq.errors import SpecqError

    target = tiny_model(vocab=32, seed=4)
    with pytest.raises(SpecqError, match="token trees"):
        for_pair(tiny_hf_qwen2(0), target, tree=TreeShape(4, 2, 2))
