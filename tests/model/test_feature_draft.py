"""Feature drafts (EAGLE style): lossless, fed the right target features, trainable, saved."""

from __future__ import annotations

import pytest
import torch

from specq import generate
from specq.core.decode import decode
from specq.drafters import FeatureDrafter
from specq.loading import kinds
from specq.core.types import Draft, Model
from specq.model.feature_draft import FeatureDraft, new_feature_draft, save
from specq.training import distill
from specq.training.distill import TeacherSet

from conftest import (PROMPTS, _exact_sequence_distribution, _feature_model, counting_stack,
                      tiny_model, without_stack)

VOCAB = 32


def _teacher_set(target: Model, n: int, seed: int) -> TeacherSet:
    """The target's greedy continuations of random prompts, with its distributions and features."""
    g = torch.Generator().manual_seed(seed)
    out = TeacherSet([], [], [], [])
    for _ in range(n):
        prompt = torch.randint(0, VOCAB, (3,), generator=g).tolist()
        ids = torch.tensor(prompt + generate(target, prompt, None, max_new_tokens=20).token_ids)
        with torch.no_grad():
            logits = target.net(ids, None)
        top_logp, top_ids = torch.log_softmax(logits, -1).topk(8, dim=-1)
        out += TeacherSet([ids], [0], [top_ids.int()], [top_logp.half()])
    return out.with_features(target.net)


@pytest.fixture(scope="module")
def trained():
    """A tiny target and a feature draft distilled on its own outputs (a few seconds)."""
    target = tiny_model(vocab=VOCAB, scale=3.0, seed=4)
    train, held = _teacher_set(target, 48, seed=1), _teacher_set(target, 8, seed=2)
    draft = _feature_model(target)
    before = distill.evaluate(draft.net, held, forward=distill.feature_forward)
    result = distill.distill(draft.net, train, held, steps=80, loss="mix:0.5", lr=5e-3, batch=8,
                             eval_every=0, progress=False, forward=distill.feature_forward)
    draft.net.eval()
    return target, draft, before, result["held_out"]


def test_distillation_teaches_a_feature_draft(trained):
    _, _, before, after = trained
    assert after["kl"] < 0.7 * before["kl"]
    assert after["top1"] > before["top1"] + 0.05


@pytest.mark.parametrize("gamma", [1, 3, 6])
@pytest.mark.parametrize("confidence", [0.0, 0.5])
def test_greedy_equality(trained, gamma, confidence):
    target, draft, _, _ = trained
    accepted = rejected = 0
    for prompt in PROMPTS:
        base = generate(target, prompt, None, max_new_tokens=30)
        spec = generate(target, prompt, draft, gamma=gamma, max_new_tokens=30,
                        draft_confidence=confidence)
        assert spec.token_ids == base.token_ids
        accepted += spec.stats.accepted
        rejected += spec.stats.drafted - spec.stats.accepted
    assert accepted > 0 and rejected > 0  # accept and reject paths both ran


def test_greedy_equality_with_a_vocabulary_subset():
    target = tiny_model(vocab=VOCAB, scale=3.0, seed=4)
    draft = _feature_model(target, vocab_ids=list(range(0, VOCAB, 2)), seed=3)
    for prompt in PROMPTS:
        base = generate(target, prompt, None, max_new_tokens=25)
        spec = generate(target, prompt, draft, gamma=3, max_new_tokens=25, draft_confidence=0.0)
        assert spec.token_ids == base.token_ids


class _Recording(FeatureDrafter):
    """Records the first-step logits of each proposal with the row that produced them."""

    def __init__(self, draft):
        super().__init__(draft)
        self.seen = []

    def propose(self, seq, gamma, sampling, generator):
        self.seen.append(len(seq) - 2)
        original = self.net.forward
        first = []

        def spy(ids, features, cache=None, **tree):
            out = original(ids, features, cache, **tree)
            if not first:
                first.append(out[0][-1].clone())
            return out

        self.net.forward = spy
        try:
            return super().propose(seq, gamma, sampling, generator)
        finally:
            del self.net.forward
            self.seen[-1] = (self.seen[-1], first[0])


def test_draft_rows_read_the_right_target_features(trained):
    """Every proposal's first token comes from row L-2 fed with true features: the same logits
    as one cache-free pass of the draft over the final sequence and the target's features."""
    target, draft, _, _ = trained
    for prompt in PROMPTS:
        drafter = _Recording(draft.net)
        ids, _, _ = decode(target, prompt, drafter=drafter, gamma=3, max_new_tokens=30)
        seq = torch.tensor(prompt + ids)
        with torch.no_grad():
            feats = target.net.hidden_states(seq)
            logits, _ = draft.net(seq[1:].unsqueeze(0), feats[:-1].unsqueeze(0))
        for row, first_logits in drafter.seen:
            assert torch.allclose(first_logits, logits[0, row], atol=1e-4), row


def test_unrolled_training_steps_match_decoding(trained):
    """Training-time test: step k of `unrolled` at row j equals the k-th draft step of a proposal
    whose true features end at f_j (its own earlier outputs as features, the true next tokens)."""
    target, draft, _, _ = trained
    seq = torch.tensor(PROMPTS[0] + generate(target, PROMPTS[0], None, max_new_tokens=12).token_ids)
    with torch.no_grad():
        feats = target.net.hidden_states(seq)
        steps = draft.net.unrolled(seq.unsqueeze(0), feats[:-1].unsqueeze(0), 3)
        assert torch.allclose(steps[0][0], draft.net(seq[1:].unsqueeze(0),
                                                     feats[:-1].unsqueeze(0))[1][0], atol=1e-5)
        for j in range(len(seq) - 4):
            cache = draft.net.new_cache(len(seq) + 4)
            _, hidden = draft.net(seq[1:j + 2], feats[:j + 1], cache)  # true rows 0..j
            for k in range(1, 3):
                _, hidden = draft.net(seq[j + k + 1:j + k + 2], hidden[-1:], cache)
                assert torch.allclose(hidden[0], steps[k][0, j], atol=1e-5), (j, k)


def test_sampling_distribution_matches_target():
    from scipy.stats import chisquare

    from specq.core.sampling import SamplingConfig

    prompt, cfg = [1, 2], SamplingConfig(temperature=1.0)
    target = tiny_model(vocab=5, hidden=16, scale=1.0, seed=11)
    # token 1 never drafted
    net = new_feature_draft(target.net, torch.tensor([0, 2, 3, 4]), seed=5).eval()
    draft = Draft(kinds.FEATURE,
                  Model(ref="feature", net=net, tokenizer=target.tokenizer, eos_ids=target.eos_ids,
                        source="random"))
    exact = _exact_sequence_distribution(target, prompt, 3, cfg)
    runs = 3000
    counts = dict.fromkeys(exact, 0)
    for seed in range(runs):
        out = generate(target, prompt, draft, gamma=2, max_new_tokens=3, temperature=1.0, seed=seed,
                       draft_confidence=0.0)
        counts[tuple(out.token_ids)] += 1
    big = [(counts[k], exact[k] * runs) for k in exact if exact[k] * runs >= 5]
    small = [(counts[k], exact[k] * runs) for k in exact if exact[k] * runs < 5]
    observed = [c for c, _ in big] + [sum(c for c, _ in small)]
    expected = [e for _, e in big] + [sum(e for _, e in small)]
    scale = sum(observed) / sum(expected)
    assert chisquare(observed, [e * scale for e in expected]).pvalue > 0.001


def test_save_and_load_through_models(trained, tmp_path):
    target, draft, _, _ = trained
    save(draft.net, tmp_path / "fd", target.tokenizer, frozenset({3}), {"note": "test"})
    loaded = kinds.load(str(tmp_path / "fd"))
    assert isinstance(loaded.net, FeatureDraft) and loaded.eos_ids == frozenset({3})
    assert loaded.vocab_size == VOCAB
    saved, back = draft.net.state_dict(), loaded.net.state_dict()
    assert saved.keys() == back.keys()
    for name, value in saved.items():  # stored in bf16: equal after the same rounding
        expected = value.to(torch.bfloat16).float() if value.is_floating_point() else value
        assert torch.equal(back[name], expected), name
    changed = sum(not torch.equal(back[n], v) for n, v in saved.items() if v.is_floating_point())
    # the rounding happened: a loader that returned the trained weights as is would fail
    assert changed > 0
    prompt = PROMPTS[0]
    a = generate(target, prompt, draft, gamma=3, max_new_tokens=20)
    b = generate(target, prompt, loaded, gamma=3, max_new_tokens=20)
    assert a.token_ids == b.token_ids and b.stats.accepted > 0


def test_bad_feature_draft_is_a_clear_error(tmp_path):
    from specq.errors import SpecqError

    (tmp_path / "fd").mkdir()
    (tmp_path / "fd" / "feature_draft.json").write_text("{broken")
    # checked before loading
    with pytest.raises(SpecqError, match=r"feature_draft.json' is not valid JSON"):
        kinds.load(str(tmp_path / "fd"))
    target = tiny_model(vocab=VOCAB)
    other = tiny_model(vocab=VOCAB, hidden=16)
    with pytest.raises(SpecqError, match="made for a target"):
        _feature_model(target).net.attach(other.net)


def test_compare_scores_sequence_and_feature_drafts(trained):
    """`specq compare`: a model against itself is at zero distance; a feature draft is scored on
    the positions where it drafts (from A's hidden states), and beta = 1 - TV holds for both."""
    from specq.training.divergence import compare

    target, draft, _, _ = trained
    chunks = [[1, 2, 3] + generate(target, [1, 2, 3], None, max_new_tokens=12).token_ids,
              [5, 6, 7, 8, 9, 10]]
    same = compare(target, target, chunks, resamples=100)
    assert same["kl_ab"]["mean"] < 1e-9 and abs(same["beta"]["mean"] - 1) < 1e-9
    result = compare(target, draft, chunks, resamples=100)
    assert 0 < result["beta"]["mean"] < 1 and result["tokens"] == sum(len(c) - 2 for c in chunks)
    assert abs(result["beta"]["mean"] + result["tv"]["mean"] - 1) < 1e-6


def test_bench_runs_a_feature_draft_and_skips_its_peer(trained, tmp_path):
    from rich.console import Console

    from specq.bench import aggregate, runner
    from specq.bench.config import validate
    from specq.bench.prompts import Prompt

    target, draft, _, _ = trained
    models_by_ref = {"tiny@fp32": target, "feat@fp32": draft}
    config = validate({"targets": ["tiny"], "drafts": ["feat"], "gamma": [2],
                       "max_new_tokens": [10], "prompt_sets": ["chat"], "threads": [1],
                       "results": str(tmp_path / "r.jsonl"), "resamples": 100, "peer": True})
    sets = {"chat": [Prompt("chat", i, f"t{i + 1} t{i + 2} t{i + 3}", False) for i in range(2)]}
    records = runner.run(config, load=lambda ref: models_by_ref[ref], prompt_sets=sets,
                         progress=False, console=Console(quiet=True))
    row = next(r for r in aggregate.summarize(records, resamples=100) if r["kind"] == "speculative")
    assert row["mismatches"] == [] and row["tau"][0] >= 1
    assert row["peer_skipped"]
    save(draft.net, tmp_path / "fd", target.tokenizer, target.eos_ids)
    assert "feature draft" in runner.peer_skip_reason(kinds.load(str(tmp_path / "fd")))


def test_a_feature_draft_with_rtn_integer_weights(trained, tmp_path):
    """`draft@int8-head8`: the draft's layers and head as per-channel int8 on the fast path's
    kernels (a cheaper draft); still lossless, with accepted and rejected tokens. Calibrated
    methods need data a draft load does not have: refused in one line."""
    from specq.errors import SpecqError

    target, draft, _, _ = trained
    save(draft.net, tmp_path / "fd", target.tokenizer, target.eos_ids)
    cheap = kinds.load(f"{tmp_path / 'fd'}@int8-head8")
    kernels = [k.name for k in cheap.runner.kernels.values()]
    # fc, the layer's 4, the head
    assert len(kernels) == 1 + 4 + 1 and all("int8dot" in k for k in kernels)
    accepted = rejected = 0
    for prompt in PROMPTS[:3]:
        plain = generate(target, prompt, None, max_new_tokens=24)
        out = generate(target, prompt, cheap, gamma=3, max_new_tokens=24, draft_confidence=0.0)
        assert out.token_ids == plain.token_ids
        accepted += out.stats.accepted
        rejected += out.stats.drafted - out.stats.accepted
    assert accepted > 0 and rejected > 0
    with pytest.raises(SpecqError, match="RTN integer weights"):
        kinds.load(f"{tmp_path / 'fd'}@int4-g32-gptq")


@torch.inference_mode()
def test_a_draft_on_the_fast_path_runs_its_layer_in_one_call(trained, tmp_path):
    """At an RTN integer spec every linear layer of the draft runs on int8dot, so its cached passes
    (a chain step, several rows, a tree's rows) go through `decoder.Stack` like a target's, and
    give the torch modules' logits, features and cache (relative RMS error: int8dot quantizes
    activations that the two round apart)."""
    from specq.core.acceptance import verify_layout

    target, draft, _, _ = trained
    save(draft.net, tmp_path / "fd", target.tokenizer, target.eos_ids)
    cheap = kinds.load(f"{tmp_path / 'fd'}@int8-head8")
    cheap.net.attach(target.net)
    stacked = cheap.runner
    assert stacked.stack is not None
    modules = without_stack(stacked)
    stacked, calls = counting_stack(stacked)
    g = torch.Generator().manual_seed(0)
    ids, features = torch.randint(0, VOCAB, (12,),
                                  generator=g), torch.randn(12, target.net.config.hidden_size,
                                                            generator=g)
    results = []
    for net in (stacked, modules):
        cache = net.new_cache(32)
        out = [net(ids[:6], features[:6], cache), net(ids[6:7], features[6:7], cache),
               net(ids[7:9], features[7:9], cache)]
        out.append(net(ids[9:12], features[9:12], cache,
                       **verify_layout(torch.tensor([-1, -1]), cache.length)))
        results.append(([t for pair in out for t in pair], cache.k[:, :, :, :cache.length].clone()))
    (a, ka), (b, kb) = results
    assert len(calls) == 3  # every cached pass but the prefill
    for x, y in zip([*a, ka], [*b, kb]):
        assert (x - y).pow(2).mean().sqrt() <= 1e-2 * y.pow(2).mean().sqrt()


@torch.inference_mode()
def test_a_narrowed_head_keeps_its_rows_and_stays_lossless(trained, tmp_path):
    """`restrict_head` keeps the draft's scores of the tokens it keeps and drops the rest (which are
    then never drafted); greedy output is still the target's, with rejections,
    and it saves and loads.
    Tokens outside the head cannot be kept."""
    from specq.errors import SpecqError
    from specq.model.feature_draft import restrict_head

    target, draft, _, _ = trained
    keep = torch.tensor([1, 3, 4, 8, 9, 15, 16, 20, 23, 31])
    narrow = restrict_head(draft.net, keep)
    assert narrow.config.vocab_size == 10 and torch.equal(narrow.vocab_ids, keep)
    ids, features = torch.tensor([5, 9, 2]), torch.randn(3, target.net.config.hidden_size)
    wide_logits, wide_hidden = draft.net(ids, features, draft.net.new_cache(8))
    logits, hidden = narrow(ids, features, narrow.new_cache(8))
    # the copy runs on torch's kernels, which may round
    torch.testing.assert_close(hidden, wide_hidden)
    torch.testing.assert_close(logits, wide_logits[:, keep])  # differently (also: a narrower GEMM)
    save(narrow, tmp_path / "narrow", target.tokenizer, target.eos_ids)
    loaded = kinds.load(str(tmp_path / "narrow"))
    drafted = rejected = 0
    for prompt in PROMPTS:
        out = generate(target, prompt, loaded, gamma=3, max_new_tokens=25, draft_confidence=0.0)
        assert out.token_ids == generate(target, prompt, None, max_new_tokens=25).token_ids
        assert set(out.token_ids) - set(keep.tolist())  # the target wrote tokens the draft cannot
        drafted += out.stats.drafted
        rejected += out.stats.drafted - out.stats.accepted
    assert drafted > rejected > 0
    with pytest.raises(SpecqError, match="not in the draft's head"):
        restrict_head(narrow, torch.tensor([1, 2]))
