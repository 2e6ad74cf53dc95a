"""`specq distill` end to end on a tiny (quantized) target: data, training, export,
registration on request, errors."""

import json

import pytest

import specq
from specq.cli import main
from specq.loading.drafts import registry

from conftest import training_files

FAST = ["--steps", "6", "--new-tokens", "8", "--text-windows", "4", "--seq-len", "16",
        "--accept-prompts", "2", "--eval-every", "3", "--checkpoint-every", "2", "--gen-batch", "3",
        "--batch", "2", "--arch", "2x32"]


@pytest.fixture()
def files(tmp_path, monkeypatch):
    return training_files(tmp_path, monkeypatch, vocab=64, hidden=64, words=60, prompts=5)


def test_distill_trains_saves_and_registers(files, capsys):
    out = files / "drafts" / "mine"
    args = ["distill", "--target", f"{files / 'target'}@int4-g32-rtn", "--out", str(out), "--texts",
            str(files / "text.txt"), "--prompts", str(files / "prompts.txt"), "--temperatures", "0",
            "0.8", "--json", "--register"]
    assert main(args + FAST) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["steps"] == 6 and report["train_positions"] > 0
            and 0 <= report["held_out"]["beta"] <= 1)
    assert report["speculative"]["prompts"] == 2 and report["step_ms"]["ratio"] > 0
    saved = json.loads((out / "distill.json").read_text())
    assert saved["settings"]["command"].startswith("specq distill")
    # finished runs leave no checkpoint
    assert not (files / "drafts" / "mine.work" / "ckpt").exists()
    # the user's registry, by path
    assert report["registered"] and not (out.parent / registry.MANIFEST).exists()
    path, entry, exact = registry.select(files / "none", registry.user_dir(), str(files / "target"),
                                         "int4-g32-rtn")
    assert exact and path == out
    assert entry.draft_spec == "" and entry.info["base"] == "new:2x32"  # the draft runs as stored
    target, draft = specq.load(f"{files / 'target'}@int4-g32-rtn"), specq.load(str(out))
    base = specq.generate(target, [1, 2, 3], None, max_new_tokens=16)
    assert (specq.generate(target, [1, 2, 3], draft, gamma=3, max_new_tokens=16).token_ids
            == base.token_ids)
    # the teacher data is cached: a second run (from the first draft) computes none of it
    again = ["distill", "--target", f"{files / 'target'}@int4-g32-rtn", "--out",
             str(files / "drafts" / "two"), "--work", str(files / "drafts" / "mine.work"), "--from",
             str(out), "--texts", str(files / "text.txt"), "--prompts", str(files / "prompts.txt"),
             "--temperatures", "0", "0.8"]
    assert main(again + [a for a in FAST if a not in ("--arch", "2x32")]) == 0
    assert "shard" not in capsys.readouterr().err
    # only when asked
    assert [e.draft for e in registry.read(registry.user_dir())] == [str(out.resolve())]


def test_distill_a_feature_draft_then_calibrate_it(files, capsys):
    """--arch feature on a quantized target: features cached with the shards, a subset head,
    saved and registered; then calibrated to another precision; both stay lossless."""
    from specq.model.feature_draft import FeatureDraft
    from specq.training.calibrate import CalibrationSettings, calibrate

    out = files / "drafts" / "feat"
    args = ["distill", "--target", f"{files / 'target'}@int4-g32-rtn", "--out", str(out), "--texts",
            str(files / "text.txt"), "--prompts", str(files / "prompts.txt"), "--json",
            "--head-vocab", "40"]
    assert main(args + ["--register"] + [a if a != "2x32" else "feature" for a in FAST]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["kind"] == "feature" and report["draft_config"]["vocab_size"] <= 41
            and report["steps"] == 6)
    assert list((files / "drafts" / "feat.work" / "teacher").glob("*/shard_000.features.pt"))
    assert report["settings"]["head_vocab"] == 40
    # no --head-vocab
    more = [a if a != str(out) else str(files / "more" / "feat") for a in args[:-2]]
    continuing = ["--from", str(out)] + [a for a in FAST if a not in ("--arch", "2x32")]
    assert main(more + continuing) == 0
    continued = json.loads(capsys.readouterr().out)  # the base's head is kept
    assert continued["draft_config"]["vocab_size"] == report["draft_config"]["vocab_size"]
    assert continued["settings"]["head_vocab"] is None
    # --head-vocab with --from narrows the base's head to its most frequent tokens;
    # --steps 0 only exports
    narrow = [a if a != str(out) else str(files / "narrow" / "feat") for a in args[:-2]]
    assert main(narrow + continuing + ["--head-vocab", "12", "--steps", "0"]) == 0
    narrowed = json.loads(capsys.readouterr().out)
    assert narrowed["steps"] == 0 and narrowed["draft_config"]["vocab_size"] <= 13
    kept = specq.load(str(files / "narrow" / "feat")).net.vocab_ids
    assert set(kept.tolist()) < set(specq.load(str(out)).net.vocab_ids.tolist())
    wide = [a if a != str(out) else str(files / "wide" / "feat") for a in args[:-2]]
    assert main(wide + continuing + ["--head-vocab", "100"]) == 2
    assert "can only be narrowed" in capsys.readouterr().err
    path, _, exact = registry.select(files / "none", registry.user_dir(), str(files / "target"),
                                     "int4-g32-rtn")
    assert exact and path == out
    target, draft = specq.load(f"{files / 'target'}@int4-g32-rtn"), specq.load(str(out))
    assert isinstance(draft.net, FeatureDraft)
    base = specq.generate(target, [1, 2, 3], None, max_new_tokens=16)
    assert (specq.generate(target, [1, 2, 3], draft, gamma=3, max_new_tokens=16).token_ids
            == base.token_ids)

    other = specq.load(f"{files / 'target'}@int8")
    calibrate(other, draft,
              CalibrationSettings(prompts=3, held_out=2, max_new_tokens=8, steps=4, batch=2),
              out=files / "drafts" / "feat-int8", progress=False)
    tuned = specq.load(str(files / "drafts" / "feat-int8"))
    assert isinstance(tuned.net, FeatureDraft)
    base = specq.generate(other, [4, 5], None, max_new_tokens=16)
    assert (specq.generate(other, [4, 5], tuned, gamma=2, max_new_tokens=16).token_ids
            == base.token_ids)
    assert main(["generate", "t1 t2", "--target", f"{files / 'target'}@int8", "--draft",
                 str(out) + "@int4-gptq", "--max-new-tokens", "4"]) == 2
    assert "RTN integer weights" in capsys.readouterr().err


def test_distill_a_lora_adapter_on_a_base(files, capsys):
    """`--lora R --from BASE` trains only an adapter on BASE's float weights and saves it alone
    (peft's format, naming BASE by its absolute path); it loads merged into BASE
    and decodes losslessly."""
    from safetensors.torch import load_file

    out = files / "adapter"
    args = ["distill", "--target", f"{files / 'target'}@int4-g32-rtn", "--out", str(out), "--from",
            str(files / "target"), "--lora", "2", "--texts", str(files / "text.txt"), "--prompts",
            str(files / "prompts.txt"), "--json", "--lr", "0.01"]
    assert main(args + FAST[:-2]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["settings"]["lora_rank"] == 2 and report["steps"] == 6
    factors = load_file(out / "adapter_model.safetensors")
    assert report["parameters"] == sum(t.numel() for t in factors.values())
    assert all("lora_A" in k or "lora_B" in k for k in factors)
    # B starts at zero: it trained
    assert any(t.abs().max() > 0 for k, t in factors.items() if "lora_B" in k)
    assert (json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"]
            == str(files / "target"))
    assert not (out / "config.json").exists()  # no copy of the base's weights
    target, draft = specq.load(f"{files / 'target'}@int4-g32-rtn"), specq.load(str(out))
    assert draft.precision == "fp32" and draft.source == str(out)
    base = specq.generate(target, [1, 2, 3], None, max_new_tokens=16)
    assert (specq.generate(target, [1, 2, 3], draft, gamma=3, max_new_tokens=16).token_ids
            == base.token_ids)


@pytest.mark.parametrize("extra, message", [
    (["--lora", "2"], "give --from"),
    (["--lora", "2", "--from", "smollm2-135m", "--head-vocab", "64"], "not --lora"),
    (["--lora", "0", "--from", "smollm2-135m"], "between 1 and 256"),
])
def test_bad_lora_input_is_one_line_before_loading(files, capsys, extra, message):
    args = (["distill", "--target", str(files / "target"), "--out", str(files / "d")]
            + FAST[:-2] + extra)
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_lora_needs_the_bases_float_weights(files, capsys):
    args = ["distill", "--target", str(files / "target"), "--out", str(files / "d"), "--from",
            f"{files / 'target'}@int8", "--lora", "2", "--texts",
            str(files / "text.txt")] + FAST[:-2]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "float weights" in err and len(err.splitlines()) == 1


def test_unfinished_run_needs_resume(files, capsys):
    work = files / "work"
    (work / "ckpt").mkdir(parents=True)
    (work / "ckpt" / "last.pt").write_bytes(b"x")
    args = ["distill", "--target", str(files / "target"), "--out", str(files / "d"), "--work",
            str(work)]
    assert main(args + FAST) == 2
    assert "--resume" in capsys.readouterr().err


@pytest.mark.parametrize("bad, message", [
    (["--arch", "3x30"], "--arch"),
    (["--arch", "feature:0"], "feature:L"),
    (["--prompts", "synthetic:0"], "synthetic:N"),
    (["--prompts", "synthetic:9-3"], "synthetic:A-B"),
    (["--prompts", "/no/such/file"], "neither"),
    (["--loss", "l2"], "loss"),
    (["--texts", "--prompts"], "no training data"),
    (["--temperatures", "-1"], "temperatures"),
    (["--head-vocab", "64"], "for feature drafts"),  # FAST's --arch is a sequence draft's
])
def test_bad_distill_input_is_one_line(files, capsys, bad, message):
    args = ["distill", "--target", str(files / "target"), "--out", str(files / "d")] + FAST + bad
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_synthetic_prompt_slices_extend_the_same_list():
    from specq.training.train import prompt_list

    assert prompt_list("synthetic:5-12") == prompt_list("synthetic:12")[5:]
    assert prompt_list("synthetic:7") == prompt_list("synthetic:0-7")
