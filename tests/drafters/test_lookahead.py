"""Lookahead drafts: the pool, the Jacobi window, the trie, the spelling, and lossless decoding
with them (greedy and sampling); CLI."""

import json

import pytest
import torch

import specq
from specq import api
from specq.cli import main
from specq.core.acceptance import depths
from specq.core.sampling import SamplingConfig
from specq.core.types import SeesVerify
from specq.drafters import LookaheadDraft, LookaheadDrafter, TreeShape
from specq.drafters.lookahead import NgramPool
from specq.errors import SpecqError
from specq.loading.formats.save import save_native
from specq.loading.kinds import for_pair
from specq.loading.refs import draft_ref, lookahead_ref

from conftest import _exact_sequence_distribution, chi_square_p, perturbed, tiny_model


pytestmark = pytest.mark.usefixtures("one_thread")


# prompts that repeat themselves (guesses get accepted), and some that do not
PROMPTS = [[3, 4, 5, 6, 7, 3, 4, 5, 6, 7, 3, 4], [9, 1, 9, 2, 9, 1, 9, 2, 9], [1, 2, 3], [5],
           [7, 7, 7, 7, 8, 9, 10, 11]]
GREEDY = SamplingConfig()


# ---------------------------------------------------------------------------------- the pool


def test_the_pool_keeps_the_latest_per_token_and_at_most_its_size():
    pool = NgramPool(size=5, per_token=2)
    for gram in [(1, 2, 3), (1, 4, 5), (1, 6, 7)]:
        pool.add(gram)
    assert pool.after(1) == [(6, 7), (4, 5)] and len(pool) == 2  # the oldest of token 1 went
    pool.add((1, 4, 5))  # seen again: the latest, not twice
    assert pool.after(1) == [(4, 5), (6, 7)] and len(pool) == 2
    for gram in [(2, 0, 0), (3, 0, 0), (4, 0, 0), (2, 1, 1)]:
        pool.add(gram)
    # full at 5: the first token refreshed longest ago (1) lost its oldest n-gram
    assert len(pool) == 5 and pool.after(1) == [(4, 5)] and pool.after(2) == [(1, 1), (0, 0)]
    pool.add((5, 0, 0))
    assert len(pool) == 5 and pool.after(1) == [] and 1 not in pool.grams
    assert pool.after(9) == []


def test_a_run_keeps_the_pool_within_its_bound():
    target = tiny_model(scale=3.0, seed=4)
    draft = LookaheadDraft(w=4, n=3, g=2, pool=12)
    drafter = LookaheadDrafter(draft)
    sizes = []
    real = drafter.verified

    def verified(choices):
        real(choices)
        sizes.append(len(drafter.pool))
        assert sum(len(kept) for kept in drafter.pool.grams.values()) == len(drafter.pool)

    drafter.verified = verified
    prompt = list(range(2, 30))  # more n-grams than the pool holds
    base = specq.generate(target, prompt, max_new_tokens=30)
    out = specq.generate(target, prompt, draft, drafter=drafter, max_new_tokens=30)
    assert out.token_ids == base.token_ids
    assert max(sizes) == 12  # it filled, and never grew past its bound


# ---------------------------------------------------------------------------------- the window


def test_the_window_takes_the_target_choices_as_its_next_guesses():
    """One Jacobi iteration per step: the target's choice after each guess is the guess for the
    position after it, shifted by what was accepted; each slot's guesses and the target's new
    choice make an n-gram in the pool."""
    drafter = LookaheadDrafter(LookaheadDraft(w=3, n=3, g=0))
    assert isinstance(drafter, SeesVerify)
    drafter.start(torch.tensor([1, 2, 3]), 64)
    pooled, add = [], drafter.pool.add
    drafter.pool.add = lambda gram: pooled.append(gram) or add(gram)
    g = torch.Generator()
    first = drafter.propose([1, 2, 3, 4], 3, GREEDY, g)  # nothing follows 4 yet: 4 again
    assert first.tokens.tolist() == [4, 4, 4] and first.parents.tolist() == [-1, 0, 1]
    drafter.verified(torch.tensor([5, 6, 7, 8]))  # rows: root, then each guess
    drafter.rollback(4, None, [])
    # 5 came next (nothing accepted): the guesses after the root are 6, 7, 8
    second = drafter.propose([1, 2, 3, 4, 5], 3, GREEDY, g)
    assert second.tokens.tolist() == [6, 7, 8]
    drafter.verified(torch.tensor([6, 7, 9, 1]))
    drafter.rollback(7, None, [0, 1])
    # each slot's two iterations and the target's choice: the first guess 4, the target's choice
    # after it (6, 7, 8), and its choice after that (7, 9, 1)
    assert pooled[-3:] == [(4, 6, 7), (4, 7, 9), (4, 8, 1)]
    # 6 and 7 accepted, 9 next: one guess left (after 8: 1), the end padded from the pool (after
    # 1: 2, after 2: 3, as in the prompt)
    third = drafter.propose([1, 2, 3, 4, 5, 6, 7, 9], 3, GREEDY, g)
    assert third.tokens.tolist() == [1, 2, 3]


def test_a_plain_step_leaves_the_window_unverified():
    """gamma auto's plain steps propose nothing: the verify pass has one row, and the window only
    drops the positions that settled."""
    drafter = LookaheadDrafter(LookaheadDraft(w=3, n=2, g=0))
    drafter.start(torch.tensor([1, 2, 3]), 64)
    g = torch.Generator()
    drafter.propose([1, 2, 3, 4], 3, GREEDY, g)
    drafter.verified(torch.tensor([5, 6, 7, 8]))
    drafter.rollback(4, None, [])
    drafter.verified(torch.tensor([6]))  # a plain step: no proposal
    drafter.rollback(5, None, [])
    assert drafter.propose([1, 2, 3, 4, 5, 6], 3, GREEDY, g).tokens.tolist() == [7, 8, 8]


def test_candidates_share_their_prefixes_and_respect_the_caps():
    """The text's continuation, then the pool's n-grams, then the window, merged into one trie:
    at most gamma deep and nodes(gamma) nodes."""
    draft = LookaheadDraft(w=2, n=4, g=3)
    drafter = LookaheadDrafter(draft)
    # after 1: the text's latest continuation of (2, 1) is 5 6 7; the pool also holds 5 6 8, 9 9 9
    drafter.start(torch.tensor([1, 9, 9, 9, 3, 1, 5, 6, 8, 2, 1, 5, 6, 7, 2]), 64)
    proposal = drafter.propose([1, 9, 9, 9, 3, 1, 5, 6, 8, 2, 1, 5, 6, 7, 2, 1], 4, GREEDY,
                               torch.Generator())
    paths = []
    for node in range(len(proposal.tokens)):
        path, at = [], node
        while at != -1:
            path.insert(0, proposal.tokens[at].item())
            at = proposal.parents[at].item()
        paths.append(tuple(path))
    assert paths[:6] == [(5,), (5, 6), (5, 6, 7), (5, 6, 8), (9,), (9, 9)]
    assert len(set(paths)) == len(paths) <= draft.nodes(4)  # a trie: no path twice
    assert proposal.probs is None  # point masses
    capped = drafter.propose([1, 9, 9, 9, 3, 1, 5, 6, 8, 2, 1, 5, 6, 7, 2, 1], 1, GREEDY,
                             torch.Generator())
    assert capped.parents.tolist() == [-1] * len(capped.tokens) and len(capped.tokens) <= 4
    assert draft.nodes(1) == 4 and draft.nodes(8) == 2 + 3 * 3 and draft.depth == 3


def test_the_text_continuation_goes_as_deep_as_the_tree():
    """Copied text goes on: the text's continuation is the window's depth, the pool's n-grams
    n - 1 tokens."""
    draft = LookaheadDraft(w=4, n=3, g=2)
    drafter = LookaheadDrafter(draft)
    prompt = [3, 4, 5, 6, 7, 3, 4, 5, 6, 7, 3, 4]
    drafter.start(torch.tensor(prompt), 64)
    proposal = drafter.propose(prompt + [5], 4, GREEDY, torch.Generator())
    tokens, parents = proposal.tokens.tolist(), proposal.parents.tolist()
    assert tokens[:4] == [6, 7, 3, 4] and parents[:4] == [-1, 0, 1, 2]
    assert len(tokens) <= draft.nodes(4) == 4 + 4 + 2
    assert max(depths(proposal.parents).tolist()) == 4


# ---------------------------------------------------------------------------------- the spelling


def test_spellings_and_their_canonical_form():
    assert lookahead_ref("lookahead").draft.ref == "lookahead:w=4:n=3:g=3"
    assert lookahead_ref("lookahead:g=0:w=7").draft.ref == "lookahead:w=7:n=3:g=0"
    assert lookahead_ref("ngram") is None and lookahead_ref("lookaheadx") is None
    ref = draft_ref("lookahead:n=3")
    assert ref.lookup_alone and not ref.grows_trees and ref.models == []
    assert ref.for_target("tiny").text == "lookahead:w=4:n=3:g=3"
    assert LookaheadDraft(w=5).ref == "lookahead:w=5:n=3:g=3"


BAD_SPECS = [("lookahead:w=0", "w must be between 1 and 64"),
             ("lookahead:n=1", "n must be between 2 and 65"),
             ("lookahead:g=65", "g must be between 0 and 64"),
             ("lookahead:w=40:g=13", "at most 64"), ("lookahead:w=a", "whole number"),
             ("lookahead:k=3", "unknown option 'k=3'"), ("lookahead:w", "unknown option"),
             ("lookahead:w=2:w=3", "given twice"), ("lookahead@int8", "no precision"),
             ("lookahead+draft", "takes no model"), ("lookahead:window=8", "window applies"),
             ("lookahead,draft", "not a level of a hierarchy"),
             ("draft,lookahead", "not a level of a hierarchy"),
             ("ngram+lookahead", "a model draft, not a lookahead draft")]


@pytest.mark.parametrize("ref,needle", BAD_SPECS)
def test_a_bad_spelling_is_one_error(ref, needle):
    with pytest.raises(SpecqError) as error:
        draft_ref(ref)
    assert needle in str(error.value) and "\n" not in str(error.value)


def test_the_api_takes_it_alone_and_without_a_tree():
    target = tiny_model()
    with pytest.raises(SpecqError, match="not a level of a hierarchy"):
        api.start(target, [1, 2], [LookaheadDraft(), perturbed(target, 0.1)])
    with pytest.raises(SpecqError, match="only be the first"):
        api.start(target, [1, 2], [perturbed(target, 0.1), LookaheadDraft()])
    with pytest.raises(SpecqError, match="its own token trees"):
        api.start(target, [1, 2], "lookahead", tree=TreeShape(4, 2, 2))
    with pytest.raises(SpecqError, match="or a lookahead draft"):
        specq.generate(target, [1, 2], "smollm2-135m-draft")


# ---------------------------------------------------------------------------------- greedy


@pytest.mark.parametrize("draft", ["lookahead", "lookahead:w=6:n=3:g=3", LookaheadDraft(w=3, g=0),
                                   LookaheadDraft(w=1, n=2, g=1)], ids=str)
@pytest.mark.parametrize("gamma", [None, 2, "auto"])
def test_greedy_lookahead_equals_the_target(draft, gamma):
    target = tiny_model(scale=3.0, seed=4)
    accepted = rejected = 0
    for prompt in PROMPTS:
        base = specq.generate(target, prompt, max_new_tokens=40)
        spec = specq.generate(target, prompt, draft, gamma=gamma, max_new_tokens=40)
        assert spec.token_ids == base.token_ids
        assert spec.draft.startswith("lookahead:w=")
        accepted += spec.stats.accepted
        rejected += spec.stats.drafted - spec.stats.accepted
    assert accepted > 0 and rejected > 0  # both paths ran


def test_the_depth_is_its_own_and_gamma_auto_chooses_up_to_it():
    target = tiny_model(scale=3.0, seed=4)
    for draft, gamma, depth in (("lookahead", 2, 4), ("lookahead:w=6", "auto", 6),
                                ("lookahead:w=2:n=5", None, 4)):
        stats = specq.generate(target, PROMPTS[0], draft, gamma=gamma, max_new_tokens=30).stats
        assert stats.gamma == depth and stats.drafted_at[0] > 0


def test_the_window_alone_gets_guesses_accepted():
    """No n-grams proposed (g=0): what is accepted comes from the Jacobi window."""
    target = tiny_model(scale=3.0, seed=4)
    accepted = 0
    for prompt in PROMPTS:
        base = specq.generate(target, prompt, max_new_tokens=40)
        spec = specq.generate(target, prompt, LookaheadDraft(w=4, g=0), gamma=4,
                              max_new_tokens=40)
        assert spec.token_ids == base.token_ids
        accepted += spec.stats.accepted
    assert accepted > 0


def test_a_batch_steps_each_sequence_as_alone():
    """Several sequences verified in one pass (the server's batching) each see their own rows."""
    from specq.core.decode import step

    target = tiny_model(scale=3.0, seed=4)
    alone = [specq.generate(target, p, "lookahead", gamma=4, max_new_tokens=24).token_ids
             for p in PROMPTS]
    sequences = [api.start(target, p, "lookahead", gamma=4, max_new_tokens=24) for p in PROMPTS]
    for sequence in sequences:
        sequence.prefill()
    while not all(s.done for s in sequences):
        step([s for s in sequences if not s.done])
    assert [s.result()[0] for s in sequences] == alone


# ---------------------------------------------------------------------------------- sampling


NEW = 4  # new tokens per sampled run


def test_sampling_with_lookahead_follows_the_target():
    """Seeded runs vs the target's computed joint distribution of the first NEW tokens: chi-square,
    deterministic. Window and n-gram nodes are point masses, several under one parent."""
    prompt = [1, 2, 3, 1, 2]
    target = tiny_model(vocab=5, hidden=16, scale=1.0, seed=11)
    draft = LookaheadDraft(w=2, n=3, g=2)
    exact = _exact_sequence_distribution(target, prompt, NEW, SamplingConfig(temperature=1.0))
    runs, counts, accepted, rejected, siblings = 2000, {}, 0, 0, 0
    for seed in range(runs):
        drafter = for_pair(draft, target)
        real = drafter.propose

        def propose(*args, real=real):
            nonlocal siblings
            proposal = real(*args)
            siblings += (proposal.parents == -1).sum().item() > 1
            return proposal

        drafter.propose = propose
        out = specq.generate(target, prompt, draft, drafter=drafter, max_new_tokens=NEW,
                             temperature=1.0, seed=seed)
        counts[tuple(out.token_ids)] = counts.get(tuple(out.token_ids), 0) + 1
        accepted += out.stats.accepted
        rejected += out.stats.drafted - out.stats.accepted
    assert accepted > runs // 10 and rejected > runs // 10 and siblings > runs // 10
    assert chi_square_p(dict.fromkeys(exact, 0) | counts, exact, runs) > 0.001


# ---------------------------------------------------------------------------------- CLI


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("lookahead")
    save_native(tiny_model(scale=3.0, seed=4), root / "target")
    return root


def test_cli_generate_with_lookahead_is_the_target_own_output(saved, capsys):
    common = ["generate", "t3 t4 t5 t6 t3 t4 t5 t6 t3 t4", "--target", str(saved / "target"),
              "--max-new-tokens", "24", "--json", "--no-warmup"]
    assert main(common + ["--no-speculative"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main(common + ["--draft", "lookahead:w=3", "--gamma", "auto"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["token_ids"] == plain["token_ids"] and out["stats"]["drafted"] > 0
    assert out["draft"] == "lookahead:w=3:n=3:g=3"
