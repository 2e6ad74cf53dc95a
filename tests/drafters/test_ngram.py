"""N-gram (prompt lookup) drafts: the index, the spelling, and lossless decoding with them, alone,
in front of a model draft (`ngram+MODEL`) and under a hierarchy; CLI, bench and server."""

import copy
import json

import pytest
import torch

import specq
from specq import api
from specq.cli import main
from specq.core import acceptance
from specq.core.sampling import SamplingConfig
from specq.core.types import Proposal
from specq.drafters import FallbackDrafter, NgramDraft, NgramDrafter, TreeShape
from specq.drafters.ngram import DEFAULT_COPY, NgramIndex
from specq.errors import SpecqError
from specq.loading.kinds import for_pair
from specq.loading.refs import draft_ref, ngram_ref
from specq.loading.formats.save import save_native

from conftest import (NGRAM_PROMPTS, _exact_sequence_distribution, _feature_model, chi_square_p,
                      ngram_index, perturbed, tiny_model)


pytestmark = pytest.mark.usefixtures("one_thread")


# ---------------------------------------------------------------------------------- the index


def test_the_continuation_of_a_match():
    assert ngram_index([1, 2, 3, 9, 1, 2]).continuation(4) == [3, 9, 1, 2]
    assert ngram_index([1, 2, 3, 9, 1, 2]).continuation(2) == [3, 9]


def test_the_longest_n_is_tried_first():
    # (1, 2) last came before 8, but (5, 1, 2) matches too: it came before 7
    tokens = [5, 1, 2, 7, 9, 1, 2, 8, 5, 1, 2]
    assert ngram_index(tokens).continuation(1) == [7]
    assert ngram_index(tokens, n_max=2).continuation(1) == [8]


def test_the_most_recent_match_wins():
    assert ngram_index([1, 2, 3, 1, 2, 4, 1, 2]).continuation(1) == [4]


def test_no_match_proposes_nothing():
    none = ngram_index([1, 2, 3, 4])
    assert none.match() is None and none.continuation(4) == []
    assert ngram_index([1, 2]).continuation(4) == []  # the last tokens never match themselves
    assert ngram_index([5, 1, 6, 1]).continuation(2) == []  # one token repeated: below n_min 2 ...
    assert ngram_index([5, 1, 6, 1], n_min=1).continuation(2) == [6, 1]  # ... not below n_min 1


def test_a_repeating_run_keeps_its_period():
    assert ngram_index([7, 7, 7]).continuation(4) == [7, 7, 7, 7]
    assert ngram_index([1, 2, 1, 2, 1]).continuation(5) == [2, 1, 2, 1, 2]


class _CountingDict(dict):
    writes = 0

    def __setitem__(self, key, value):
        type(self).writes += 1
        super().__setitem__(key, value)


def test_the_index_updates_incrementally():
    """Piece by piece it holds what one pass over the whole sequence holds, and each new token
    costs n_max - n_min + 1 writes, however long the sequence already is."""
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 6, (300,), generator=g).tolist()
    whole = ngram_index(tokens, 1, 4)
    pieces = NgramIndex(1, 4)
    for start in range(0, 300, 7):
        pieces.extend(tokens[start:start + 7])
        assert pieces.match() == ngram_index(tokens[:start + 7], 1, 4).match()
    assert pieces.latest == whole.latest and pieces.tokens == tokens
    pieces.latest = _CountingDict(pieces.latest)
    pieces.extend([3])
    assert _CountingDict.writes == 4


def test_the_drafter_proposes_point_masses_up_to_its_cap():
    drafter = NgramDrafter(NgramDraft(k=3, copy=0))  # copies: test_ngram_copy.py
    drafter.start(torch.tensor([1, 2, 3, 4, 5, 1]), 64, None)
    sampling, g = SamplingConfig(temperature=1.0), torch.Generator()
    # (1, 9): no match
    assert drafter.propose([1, 2, 3, 4, 5, 1, 9], 4, sampling, g).tokens.numel() == 0
    # the index took 9, 1, 2 on the way
    proposal = drafter.propose([1, 2, 3, 4, 5, 1, 9, 1, 2], 4, sampling, g)
    # k 3; chosen, not sampled
    assert proposal.tokens.tolist() == [3, 4, 5] and proposal.probs is None
    assert proposal.parents.tolist() == [-1, 0, 1]
    # the step's cap
    assert drafter.propose([1, 2, 3, 4, 5, 1, 9, 1, 2], 2, sampling, g).tokens.tolist() == [3, 4]
    assert drafter.nodes(2) == 2 and drafter.nodes(8) == 3


# ---------------------------------------------------------------------------------- the spelling


def test_spellings_and_their_canonical_form():
    assert ngram_ref("ngram").fallback is None
    assert ngram_ref("ngram").draft.ref == "ngram:n=2-3:k=4:c=16"
    assert ngram_ref("ngram:n=5").draft.ref == "ngram:n=2-5:k=4:c=16"  # n=N: down to 2 ...
    assert ngram_ref("ngram:n=1:c=0").draft.ref == "ngram:n=1-1:k=4:c=0"  # ... or N if smaller
    assert ngram_ref("ngram:k=6:n=1-4").draft.ref == "ngram:n=1-4:k=6:c=16"
    assert ngram_ref("ngram:c=8").draft.copy == 8
    assert ngram_ref("ngram:c=8:k=3").draft.ref == "ngram:n=2-3:k=3:c=8"
    assert ngram_ref("ngram:c=0").draft.ref == "ngram:n=2-3:k=4:c=0"  # no copy route
    for text in ("ngram:c=0", "ngram:n=1:c=0", "ngram:c=8:k=3", "ngram:n=4-6"):
        canonical = ngram_ref(text).draft
        assert ngram_ref(canonical.ref).draft.copy == canonical.copy  # the spelling reads back
    assert (draft_ref("ngram:c=0+self@int8").for_target("tiny@fp32").text
            == "ngram:n=2-3:k=4:c=0+tiny@int8")
    lookup = ngram_ref("ngram:k=3+self@int8")
    assert (lookup.draft.k, lookup.fallback.text) == (3, "self@int8")
    assert ngram_ref("smollm2-135m") is None
    assert (draft_ref("ngram+self@int8").for_target("tiny@fp32").text
            == "ngram:n=2-3:k=4:c=16+tiny@int8")
    assert [m.text for m in draft_ref("ngram:k=3+a@bf16,b").models] == ["a@bf16", "b"]
    assert draft_ref("ngram:k=2").lookup_alone and not draft_ref("ngram+a").lookup_alone
    assert not draft_ref("ngram,a").lookup_alone and not draft_ref("ngram,a").grows_trees


BAD_SPECS = [("ngram:n=0", "n must be between 1 and 64"),
             ("ngram:n=65", "n must be between 1 and 64"),
             ("ngram:k=0", "k must be between 1 and 64"),
             ("ngram:k=65", "k must be between 1 and 64"),
             ("ngram:n=3-2", "MIN of n=MIN-MAX, at most MAX"), ("ngram:n=a", "whole number"),
             ("ngram:n=1-", "whole number"), ("ngram:k=²", "whole number"),
             ("ngram:x=1", "unknown option 'x=1'"), ("ngram:k", "unknown option"),
             ("ngram:c=65", "c must be between 0 and 64"), ("ngram:c=-1", "whole number"),
             ("ngram:k=3:k=4", "given twice"), ("ngram@int8", "no precision"),
             ("ngram+", "after '+'")]


@pytest.mark.parametrize("ref,needle", BAD_SPECS)
def test_a_bad_spelling_is_one_error(ref, needle):
    with pytest.raises(SpecqError) as error:
        draft_ref(ref)
    assert needle in str(error.value)


def test_an_ngram_level_comes_first_in_a_hierarchy():
    with pytest.raises(SpecqError, match="only be the first"):
        draft_ref("a,ngram")
    target = tiny_model()
    with pytest.raises(SpecqError, match="only be the first"):
        api.start(target, [1, 2], [perturbed(target, 0.1), NgramDraft()])


# ---------------------------------------------------------------------------------- greedy


def _greedy_runs(target, draft, **options) -> tuple[int, int, int]:
    """Each prompt's output with `draft` equals the target's own; (accepted,
    rejected, plain steps)."""
    accepted = rejected = plain = 0
    for prompt in NGRAM_PROMPTS:
        base = specq.generate(target, prompt, None, max_new_tokens=40)
        spec = specq.generate(target, prompt, draft, max_new_tokens=40, **options)
        assert spec.token_ids == base.token_ids
        accepted += spec.stats.accepted
        rejected += spec.stats.drafted - spec.stats.accepted
        plain += spec.stats.steps - spec.stats.drafted_at[0]
    return accepted, rejected, plain


@pytest.mark.parametrize("draft", ["ngram", "ngram:n=1-3:k=6", NgramDraft(2, 1, 2)], ids=str)
@pytest.mark.parametrize("gamma", [2, "auto"])
def test_greedy_ngram_equals_the_target(draft, gamma):
    accepted, rejected, plain = _greedy_runs(tiny_model(scale=3.0, seed=4), draft, gamma=gamma)
    assert accepted > 0 and rejected > 0  # both paths ran
    assert plain > 0  # and steps with no match: plain steps


def test_the_draft_length_is_k_or_c():
    target = tiny_model(scale=3.0, seed=4)
    for draft, gamma, longest in (("ngram", 2, DEFAULT_COPY), ("ngram:k=7:c=0", 1, 7),
                                  ("ngram:k=7:c=0", "auto", 7), ("ngram:k=2:c=0", "auto", 2),
                                  ("ngram:k=7:c=5", "auto", 7),
                                  ("ngram:k=2", "auto", DEFAULT_COPY)):
        stats = specq.generate(target, NGRAM_PROMPTS[0], draft, gamma=gamma,
                               max_new_tokens=30).stats
        assert stats.gamma == longest and len(stats.drafted_at) == longest
        assert stats.drafted_at[0] > 0


def _spied(**drafters) -> dict[str, int]:
    """Counts, per name, the proposals with tokens of each drafter given."""
    counts = dict.fromkeys(drafters, 0)
    for part, inner in drafters.items():
        real = inner.propose

        def propose(*args, real=real, part=part):
            proposal = real(*args)
            counts[part] += len(proposal.tokens) > 0
            return proposal
        inner.propose = propose
    return counts


@pytest.mark.parametrize("kind", ["sequence", "feature", "tree"])
def test_greedy_ngram_with_a_model_fallback_equals_the_target(kind):
    """Steps alternate between lookups and the model: the model's cache (or a feature draft's
    store of target features) follows the tokens the lookups got accepted."""
    target = tiny_model(scale=3.0, seed=4)
    model = _feature_model(target) if kind == "feature" else perturbed(target, 0.3, seed=2)
    tree = TreeShape(4, 2, 2) if kind == "tree" else None
    draft = NgramDraft(fallback=model)
    accepted = rejected = 0
    counts = {"first": 0, "then": 0}
    for prompt in NGRAM_PROMPTS:
        base = specq.generate(target, prompt, None, max_new_tokens=40)
        drafter = for_pair(draft, target, 0.0, tree, 2)
        assert isinstance(drafter, FallbackDrafter) and isinstance(drafter.first, NgramDrafter)
        spied = _spied(first=drafter.first, then=drafter.then)
        spec = specq.generate(target, prompt, draft, drafter=drafter, gamma=2, max_new_tokens=40,
                              tree=tree)
        assert spec.token_ids == base.token_ids
        assert spec.draft == f"ngram:n=2-3:k=4:c=16+{model.ref}"
        accepted += spec.stats.accepted
        rejected += spec.stats.drafted - spec.stats.accepted
        counts = {k: counts[k] + spied[k] for k in counts}
    assert accepted > 0 and rejected > 0
    assert counts["first"] > 0 and counts["then"] > 0  # both drafters proposed


def test_gamma_auto_keeps_costs_per_route_with_a_model_fallback():
    """With `ngram+MODEL` and gamma auto, steps the lookup drafts and steps the model drafts are
    priced apart (a free lookup and a model forward), each up to its own length (the lookup's k,
    the model's AUTO_MAX_GAMMA), and the output stays the target's."""
    from specq.core.decode import run
    from specq.core.gamma import AUTO_MAX_GAMMA

    target = tiny_model(scale=3.0, seed=4)
    draft = NgramDraft(k=7, copy=0, fallback=perturbed(target, 0.3, seed=2))
    routes = set()
    for prompt in NGRAM_PROMPTS:
        base = specq.generate(target, prompt, None, max_new_tokens=40)
        sequence = api.start(target, prompt, draft, gamma="auto", max_new_tokens=40)
        run(sequence)
        assert sequence.generated == base.token_ids
        routes |= set(sequence.choosers)
        for name, chooser in sequence.choosers.items():
            assert chooser.draft_s is not None, name  # each route's own draft cost was measured
            assert chooser.max_gamma == {"lookup": 7, "model": AUTO_MAX_GAMMA}[name]
    assert routes == {"lookup", "model"}  # c=0: no copy route (with one: test_ngram_copy.py)
    plain = api.start(target, NGRAM_PROMPTS[0], perturbed(target, 0.3, seed=2), gamma="auto",
                      max_new_tokens=40)
    run(plain)
    assert set(plain.choosers) == {""}  # one drafter: one route


class WrongLookup:
    """A lookup that matches after every token and is always wrong (`token` repeated, a token the
    target never emits)."""

    needs_target_features = False
    proposals = 0

    def __init__(self, token: int):
        self.token = token

    def nodes(self, gamma):
        return min(gamma, 4)

    def start(self, prompt, capacity, features=None):
        pass

    def route_after(self, seq):
        return "lookup"

    def proposed(self):
        return "lookup"

    def longest(self, route, gamma):
        return self.nodes(gamma)

    def propose(self, seq, gamma, sampling, generator):
        self.proposals += 1
        return Proposal.chain(torch.full((self.nodes(gamma),), self.token))

    def rollback(self, length, features, path):
        pass


def test_gamma_auto_routes_each_step_to_the_drafter_that_pays(monkeypatch):
    """A lookup that matches everywhere but is always wrong is tried, rejected and then passed
    over for the model (here the target itself: always right), with a try now and then; the
    stats count each route's steps; the output stays the target's. Costs are scripted (a draft
    token a tenth of a one-row pass, each more row a twentieth), so the choice is the machine's
    on a model draft a tenth of its target's size, whatever this machine's timings."""
    from specq.core.decode import run
    from specq.core.gamma import CostAwareGamma

    observe = CostAwareGamma.observe
    monkeypatch.setattr(CostAwareGamma, "observe",
                        lambda self, cap, drafted, accepted, _d, _v, nodes=None:
                        observe(self, cap, drafted, accepted, 0.1 * drafted, 1 + drafted / 20))
    target = tiny_model(scale=3.0, seed=4)
    prompt = [5, 6, 7]
    base = specq.generate(target, prompt, None, max_new_tokens=80)
    never = min(set(range(target.vocab_size)) - set(base.token_ids))
    model = api.start(target, prompt, copy.deepcopy(target), gamma="auto").drafter
    lookup = WrongLookup(never)
    sequence = api.start(target, prompt, gamma="auto", max_new_tokens=80,
                         drafter=FallbackDrafter(lookup, model, 4))
    run(sequence)
    assert sequence.generated == base.token_ids
    routes = sequence.stats.routes
    assert routes["lookup"]["drafted"] > 0 and routes["lookup"]["accepted"] == 0  # rejected
    assert routes["model"]["accepted"] > 0
    assert routes["model"]["steps"] > 3 * routes["lookup"]["steps"] > 0
    assert lookup.proposals == routes["lookup"]["steps"]


def test_greedy_ngram_under_a_hierarchy_equals_the_target():
    """ngram,MODEL: the model verifies the lookup's tokens and hands up a chain."""
    target = tiny_model(scale=3.0, seed=4)
    accepted, rejected, _ = _greedy_runs(target, [NgramDraft(), perturbed(target, 0.3, seed=2)],
                                         gamma=3)
    assert accepted > 0 and rejected > 0


def test_no_trees_from_an_ngram_alone():
    target = tiny_model()
    with pytest.raises(SpecqError, match="proposes chains"):
        api.start(target, [1, 2], "ngram", tree=TreeShape(4, 2, 2))


def test_text_drafts_in_the_api_are_ngram_specs_only():
    target = tiny_model()
    with pytest.raises(SpecqError, match="load a model draft with specq.load"):
        specq.generate(target, [1, 2], "smollm2-135m-draft")
    with pytest.raises(SpecqError, match="fallback as a loaded model"):
        specq.generate(target, [1, 2], "ngram+smollm2-135m-draft")
    with pytest.raises(SpecqError, match="fallback must be a model"):
        NgramDraft(fallback="smollm2-135m-draft")


# ---------------------------------------------------------------------------------- sampling


NEW = 4  # new tokens per sampled run: two verify passes, the first with up to two draft tokens


def _sampling_counts(target, draft, runs: int, prompt: list[int]):
    """Outputs of NEW tokens (temperature 1) over `runs` seeds; (counts, accepted, rejected,
    proposals with tokens from the lookup and from the fallback model)."""
    counts, accepted, rejected, proposed = {}, 0, 0, {"first": 0, "then": 0}
    for seed in range(runs):
        drafter = for_pair(draft, target, 0.0, None, 2)
        spied = (_spied(first=drafter.first, then=drafter.then)
                 if isinstance(drafter, FallbackDrafter) else
                 _spied(first=drafter))
        out = specq.generate(target, prompt, draft, drafter=drafter, gamma=2, max_new_tokens=NEW,
                             temperature=1.0, seed=seed)
        counts[tuple(out.token_ids)] = counts.get(tuple(out.token_ids), 0) + 1
        accepted += out.stats.accepted
        rejected += out.stats.drafted - out.stats.accepted
        proposed = {k: proposed[k] + spied.get(k, 0) for k in proposed}
    return counts, accepted, rejected, proposed


@pytest.mark.parametrize("fallback", [False, True], ids=["alone", "with a model fallback"])
def test_sampling_with_ngram_drafts_follows_the_target(fallback):
    """Seeded runs vs the target's computed joint distribution of the first NEW tokens: chi-square,
    deterministic. Lookup nodes are point masses; the fallback's are sampled from q."""
    prompt = [1, 2, 3, 1, 2]
    target = tiny_model(vocab=5, hidden=16, scale=1.0, seed=11)
    model = tiny_model(vocab=5, hidden=16, scale=1.5, seed=12)
    draft = NgramDraft(2, 2, 2, fallback=model) if fallback else NgramDraft(2, 1, 2)
    exact = _exact_sequence_distribution(target, prompt, NEW, SamplingConfig(temperature=1.0))
    runs = 2000
    counts, accepted, rejected, proposed = _sampling_counts(target, draft, runs, prompt)
    assert accepted > runs // 10 and rejected > runs // 10 and proposed["first"] > runs // 10
    assert not fallback or proposed["then"] > runs // 10
    assert chi_square_p(dict.fromkeys(exact, 0) | counts, exact, runs) > 0.001


def test_the_sampling_check_catches_point_masses_treated_as_spread_out(monkeypatch):
    """The same check fails when acceptance takes a lookup node's q for
    uniform, not a point mass."""
    monkeypatch.setattr(acceptance, "_point_mass",
                        lambda token, like: torch.full_like(like, 1 / like.shape[-1]))
    prompt = [1, 2, 3, 1, 2]
    target = tiny_model(vocab=5, hidden=16, scale=1.0, seed=11)
    exact = _exact_sequence_distribution(target, prompt, NEW, SamplingConfig(temperature=1.0))
    counts, *_ = _sampling_counts(target, NgramDraft(2, 1, 2), 2000, prompt)
    assert chi_square_p(dict.fromkeys(exact, 0) | counts, exact, 2000) < 0.001


# ---------------------------------------------------------------------------------- CLI


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("ngram")
    target = tiny_model(scale=3.0, seed=4)
    save_native(target, root / "target")
    save_native(perturbed(target, 0.3, seed=2), root / "draft")
    return root


CLI_BAD = [(["--draft", "ngram:k=0"], "k must be between 1 and 64"),
           (["--draft", "ngram:x=1"], "unknown option"),
           (["--draft", "ngram", "--gamma", "3"], "its k (ngram:k=N), not --gamma"),
           (["--draft", "ngram", "--tree", "4"], "proposes chains"),
           (["--draft", "smollm2-135m-draft,ngram"], "only be the first"),
           (["--draft", "ngram@int8"], "no precision"),
           (["--draft", "ngram+"], "after '+'"),
           (["--draft", "lookahead:w=0"], "w must be between 1 and 64"),
           (["--draft", "lookahead:x=1"], "unknown option"),
           (["--draft", "lookahead", "--gamma", "3"], "not --gamma"),
           (["--draft", "lookahead", "--tree", "4"], "its own token trees"),
           (["--draft", "lookahead+smollm2-135m-draft"], "takes no model"),
           (["--draft", "lookahead@int8"], "no precision")]


@pytest.mark.parametrize("args,needle", CLI_BAD)
def test_cli_bad_lookup_drafts_fail_before_any_model_loads(args, needle, capsys, monkeypatch):
    """A bad n-gram or lookahead draft ref: one line, exit 2, no model loaded."""
    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr("specq.loading.kinds.load", no_loading)
    assert main(["generate", "hi", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err and "Traceback" not in err


@pytest.mark.parametrize("draft", ["ngram", "ngram:n=1-2:k=5+{root}/draft", "ngram,{root}/draft"])
def test_cli_generate_with_ngram_drafts_is_the_target_own_output(saved, draft, capsys):
    common = ["generate", "t3 t4 t5 t6 t3 t4 t5 t6 t3 t4", "--target", str(saved / "target"),
              "--max-new-tokens", "24", "--json", "--no-warmup"]
    assert main(common + ["--no-speculative"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main(common + ["--draft", draft.format(root=saved), "--gamma", "auto"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["token_ids"] == plain["token_ids"] and out["stats"]["drafted"] > 0
    assert out["draft"].startswith("ngram:n=")
