"""Layer-skip self drafts (`MODEL@skip[=LAYERS]`, `self@skip`): some of the target's own layers,
on the target's modules and kernels, chosen by a short calibration (cached) or listed."""

import json
import os
import re

import pytest
import torch

import specq
from specq import backends, generate
from specq.cli import main
from specq.drafters import TreeShape
from specq.drafters.sequence import SequenceDrafter
from specq.errors import SpecqError
from specq.loading import kinds, layer_skip, skip_calibration
from specq.loading.formats.save import save_native
from specq.loading.refs import check_ref, draft_ref, model_ref

from conftest import (_config, _exact_sequence_distribution, assert_speculative_is_plain,
                      chi_square_p, sampled_outputs, tiny_hf_qwen2, tiny_model)

TINY_PROMPTS = ["t1 t2 t3 t4", "t9 t8 t7", "t5 t5 t6"]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty $SPECQ_CACHE, calibration prompts in the tiny vocabulary, and the calls to the
    calibration (a list of the models calibrated)."""
    monkeypatch.setenv("SPECQ_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(skip_calibration, "prompts", lambda: TINY_PROMPTS)
    calls, calibrate = [], skip_calibration.calibrate
    monkeypatch.setattr(skip_calibration, "calibrate",
                        lambda model: calls.append(model.ref) or calibrate(model))
    return calls


def idle(model, layers: tuple[int, ...]):
    """`model` with these layers adding nothing to the residual stream (their output weights
    zero): layers a draft can skip without changing a token."""
    with torch.no_grad():
        for i in layers:
            model.net.layers[i].attention.wo.weight.zero_()
            model.net.layers[i].feed_forward.w2.weight.zero_()
    return model


def test_self_skip_refs_name_the_target_and_its_layers():
    def resolved(draft: str, target: str) -> str:
        return draft_ref(draft).for_target(target).text

    assert resolved("self@skip", "smollm2-135m@int8") == "smollm2-135m@int8@skip"
    assert resolved("self@skip=3-5+9:window=64", "a.gguf") == "a.gguf@skip=3-5+9:window=64"
    assert resolved("self@gguf-int4@skip", "a.gguf") == "a.gguf@gguf-int4@skip"
    assert resolved("ngram+self@skip=1+2", "m") == "ngram:n=2-3:k=4:c=16+m@skip=1+2"
    assert model_ref("self@skip").is_self and model_ref("self@int8@skip").is_self
    assert not model_ref("other@skip").is_self and model_ref("other@skip").skips.text == "other"
    assert layer_skip.parse("skip=9+3-5+4") == layer_skip.SkipSpec((3, 4, 5, 9))
    assert str(layer_skip.parse("skip=9+3-5+4")) == "skip=3-5+9" and str(layer_skip.parse("skip"))
    assert kinds.recognize("self@skip") is kinds.SKIP
    assert kinds.recognize("self@int8") is kinds.SELF_KIND


@pytest.mark.parametrize("ref, needle", [
    ("self@skip=", "bad layer-skip spec 'skip='"), ("self@skip=5-3", "at '5-3'"),
    ("self@skip=1,2", "skips with '+'"), ("self@skip=x", "at 'x'"),
    ("self@skip@skip", "without a window or skip of its own"),
    ("self@int9@skip", "bad quant spec 'int9'"), ("smollm2-135m@int9@skip", "bad quant spec")])
def test_a_bad_skip_ref_is_one_line_before_any_model_loads(ref, needle, monkeypatch, capsys):
    monkeypatch.setattr(kinds, "load", lambda *a, **k: pytest.fail("a model loaded"))
    with pytest.raises(SpecqError, match=re.escape(needle)):
        for level in draft_ref(ref).for_target("smollm2-135m").models:
            check_ref(level)
    assert main(["generate", "--target", "smollm2-135m", "--draft", ref, "t1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err, err
    assert main(["bench", "--targets", "smollm2-135m", "--drafts", ref]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err, err


def test_a_skip_draft_runs_the_targets_modules_on_its_kernels():
    """No second copy: the draft's network is the target's, its runner the target's kernel table;
    its cache (the drafter's, from the runner) holds the kept layers only."""
    target = tiny_model(layers=5, scale=3.0)
    target.runner = backends.runner(target.net, "kernels")
    before = sum(p.numel() for p in target.net.parameters())
    draft = specq.load("self@skip=1+3", target=target)
    assert kinds.kind_of(draft) is kinds.SKIP and draft.ref == "tiny@skip=1+3"
    assert draft.net is target.net and draft.runner.kernels is target.runner.kernels
    assert draft.info["kept_layers"] == [0, 2, 4] and draft.info["skipped"] == "1+3"
    drafter = kinds.for_pair(draft, target)
    assert isinstance(drafter, SequenceDrafter)
    drafter.start(torch.tensor([1, 2, 3]), 16)
    assert drafter.cache.k.shape[0] == 3
    assert sum(p.numel() for p in target.net.parameters()) == before


def test_where_a_skip_draft_cannot_load_it_says_so_in_one_line():
    target = tiny_model(layers=4)
    with pytest.raises(SpecqError, match="has 4 layers"):
        specq.load("self@skip=2-4", target=target)
    with pytest.raises(SpecqError, match="skip some of them, not all"):
        specq.load("self@skip=0-3", target=target)
    with pytest.raises(SpecqError, match="none between the first and the last"):
        specq.load("self@skip", target=tiny_model(layers=2))
    with pytest.raises(SpecqError, match="load it with its target"):
        specq.load("self@skip")
    with pytest.raises(SpecqError, match="native decoder"):
        specq.load("self@skip=1", target=tiny_hf_qwen2(0, layers=3))


@pytest.mark.parametrize("options", [dict(gamma=4), dict(gamma="auto"),
                                     dict(tree=TreeShape(8, 3, 2))],
                         ids=["gamma4", "auto", "tree8"])
def test_greedy_skip_speculation_equals_the_target(options):
    target = tiny_model(layers=5, scale=3.0, seed=4)
    target.runner = backends.runner(target.net, "kernels")
    draft = specq.load("self@skip=2", target=target)
    accepted = rejected = 0
    for prompt in ([1, 2, 3], [5, 6, 7, 8, 9]):
        base = generate(target, prompt, max_new_tokens=40)
        spec = generate(target, prompt, draft, max_new_tokens=40, draft_confidence=0.0, **options)
        assert spec.token_ids == base.token_ids
        accepted += spec.stats.accepted
        rejected += spec.stats.drafted - spec.stats.accepted
    assert accepted > 0 and rejected > 0


@pytest.mark.parametrize("switches", [{}, dict(scale_embeddings=True, sliding_window=4,
                                                sliding_layers=(1, 2), rope_local_theta=100.0)],
                         ids=["llama", "gemma-like"])
def test_greedy_skip_speculation_accepts_and_rejects(switches):
    """Also where the kept layers slide over windows of their own, with a rope of their own."""
    target = tiny_model(layers=4, scale=3.0, seed=2, **switches)
    target.runner = backends.runner(target.net, "kernels")
    assert_speculative_is_plain(target, specq.load("self@skip=1", target=target))


def test_skip_speculative_sampling_follows_the_target():
    prompt = [1, 2]
    target = tiny_model(vocab=5, hidden=16, layers=3, scale=1.0, seed=11)
    draft = specq.load("self@skip=1", target=target)
    exact = _exact_sequence_distribution(target, prompt, 3, _config())
    runs = 2000
    counts, rejected = sampled_outputs(target, draft, prompt, runs)
    assert rejected > 0
    assert chi_square_p(counts, exact, runs) > 0.001


def test_calibration_skips_the_layers_that_add_nothing(cache, capsys):
    """Layers whose output weights are zero change no token when skipped: the calibration drops
    them (agreement 1, a gain above 1), never the first or the last, and says so in one line."""
    target = idle(tiny_model(layers=6, scale=3.0, seed=3), (2, 3))
    draft = specq.load("self@skip", target=target)
    kept, total = draft.info["kept_layers"], 6
    assert kept[0] == 0 and kept[-1] == total - 1 and not {2, 3} & set(kept)
    assert draft.info["calibration"]["agreement"] == 1.0 and draft.info["calibration"]["gain"] > 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "calibrating a layer-skip self draft for tiny" in err
    assert f"keeps {len(kept)} of 6 layers" in err
    spec = generate(target, [1, 2, 3], draft, max_new_tokens=24, gamma=4)
    assert spec.token_ids == generate(target, [1, 2, 3], max_new_tokens=24).token_ids
    assert spec.stats.accepted > 0


def test_the_gain_prices_agreement_against_the_draft_cost():
    assert skip_calibration.gain(0.8, 0.5) == pytest.approx((1 + 0.8 + 0.64) / 2)
    assert skip_calibration.gain(0.0, 0.1) < 1 and skip_calibration.gain(0.99, 1.0) < 1
    assert skip_calibration.gain(1.0, 0.0) == pytest.approx(9)


def test_the_calibrated_choice_is_cached_reused_and_remade(cache, tmp_path, capsys):
    """Cached by the model's files: a second load reads it (no calibration); a damaged entry, one
    for another layer count, or a file changed in place calibrates again."""
    save_native(tiny_model(layers=5, scale=3.0, seed=6), tmp_path / "m")
    target = specq.load(str(tmp_path / "m"))
    first = specq.load("self@skip", target=target)
    entries = list((tmp_path / "cache" / "layer-skip").glob("*.json"))
    assert len(cache) == 1 and len(entries) == 1
    saved = json.loads(entries[0].read_text())
    assert saved["kept"] == first.info["kept_layers"] and saved["layers"] == 5
    again = specq.load("self@skip", target=specq.load(str(tmp_path / "m")))
    assert len(cache) == 1 and again.info["kept_layers"] == first.info["kept_layers"]
    capsys.readouterr()
    for damaged in ("{not json", json.dumps(saved | {"kept": [0, 3, 2, 4]}),
                    json.dumps(saved | {"layers": 7}), json.dumps(saved | {"kept": [1, 4]}),
                    json.dumps({k: v for k, v in saved.items() if k != "gain"})):
        entries[0].write_text(damaged)
        remade = specq.load("self@skip", target=target)
        assert remade.info["kept_layers"] == first.info["kept_layers"]
        remade_entry = json.loads(entries[0].read_text())
        assert remade_entry | {"seconds": 0} == saved | {"seconds": 0}
    assert len(cache) == 6 and capsys.readouterr().err.count("calibrating") == 5
    weights = tmp_path / "m" / "model.safetensors"
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    specq.load("self@skip", target=specq.load(str(tmp_path / "m")))
    assert len(cache) == 7 and len(list(entries[0].parent.glob("*.json"))) == 2


def test_skip_drafts_share_the_loaded_target_in_the_server_pool_and_the_bench(tmp_path):
    from specq.bench.runner import _Models
    from specq.serve.pool import ModelPool

    save_native(tiny_model(layers=4, scale=3.0), tmp_path / "m")
    pool = ModelPool(str(tmp_path / "m"), draft="self@skip=2")
    target, draft, _ = pool.models("fp32")
    assert draft.net is target.net and draft.runner.kernels is target.runner.kernels
    models = _Models(lambda ref, **kw: kinds.load(ref, None, **kw), "kernels")
    ref = draft_ref("self@skip=1").for_target(f"{tmp_path / 'm'}").models[0].text
    bench_draft, bench_target = models.get(ref)[0], models.get(str(tmp_path / "m"))[0]
    assert bench_draft.net is bench_target.net
    assert bench_draft.runner.kernels is bench_target.runner.kernels
    assert bench_draft.info["kept_layers"] == [0, 2, 3]


def test_self_at_a_spec_with_skip_runs_layers_of_that_copy(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECQ_CACHE", str(tmp_path / "cache"))
    save_native(tiny_model(layers=4, scale=3.0, seed=1), tmp_path / "m")
    target = specq.load(str(tmp_path / "m"))
    draft = specq.load("self@int8@skip=2", target=target)
    assert draft.ref == f"{tmp_path / 'm'}@int8@skip=2"
    assert draft.net is not target.net and draft.precision == "int8"
    assert draft.info["kept_layers"] == [0, 1, 3]
    assert_speculative_is_plain(target, draft)


@pytest.mark.real
def test_real_self_skip_calibrates_and_speculates_losslessly(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECQ_CACHE", str(tmp_path))
    target = specq.load("smollm2-135m")
    draft = specq.load("self@skip", target=target)
    calibration = draft.info["calibration"]
    assert 2 <= len(draft.info["kept_layers"]) < 30 and 0 < calibration["agreement"] < 1
    prompt = "The capital of France is"
    base = generate(target, prompt, max_new_tokens=24)
    spec = generate(target, prompt, draft, max_new_tokens=24, gamma=3)
    assert spec.token_ids == base.token_ids and spec.stats.drafted > 0
