"""`specq calibrate` on tiny models: runs end to end, registers the draft, refuses
foreign vocabularies."""

import pytest

import specq
from specq.errors import SpecqError
from specq.loading.drafts import registry
from specq.loading.formats.save import save_native
from specq.training.calibrate import CalibrationSettings, calibrate

from conftest import perturbed, tiny_model, tiny_tokenizer

SMALL = CalibrationSettings(prompts=4, held_out=2, max_new_tokens=12, steps=6, batch=2)


@pytest.fixture()
def dirs(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECQ_CACHE", str(tmp_path / "cache"))
    target = tiny_model(vocab=64, hidden=64, scale=3.0)
    save_native(target, tmp_path / "target")
    save_native(perturbed(target, 0.3), tmp_path / "draft")
    return tmp_path


def test_calibrate_registers_draft_for_target_precision(dirs):
    target = specq.load(f"{dirs / 'target'}@int4-g32-rtn")
    draft = specq.load(str(dirs / "draft"))
    report = calibrate(target, draft, SMALL, progress=False, register=True)
    for when in ("before", "after"):
        mean, low, high = report[when]["acceptance_rate"]
        assert 0 <= low <= mean <= high <= 1
    out = dirs / "cache" / "drafts" / "draft-for-int4-g32-rtn"
    assert (out / "config.json").is_file() and not list(out.parent.glob(".*ckpt"))
    path, entry, exact = registry.select(dirs / "none", out.parent, str(dirs / "target"),
                                         "int4-g32-rtn")
    assert exact and path == out
    from specq.loading.drafts.select import select_draft

    # what `specq generate` picks: loadable as is
    ref, _ = select_draft(f"{dirs / 'target'}@int4-g32-rtn")
    assert ref == str(out) and entry.draft_spec == "" and entry.info["base"] == draft.ref
    tuned = specq.load(ref)  # the calibrated draft still gives the target's own output
    base = specq.generate(target, [1, 2, 3], None, max_new_tokens=20)
    assert (specq.generate(target, [1, 2, 3], tuned, gamma=3, max_new_tokens=20).token_ids
            == base.token_ids)


def test_calibrate_refuses_foreign_vocabulary(dirs):
    target = specq.load(str(dirs / "target"))
    foreign = tiny_model(vocab=64, hidden=64)
    foreign.tokenizer = tiny_tokenizer(64, prefix="u")
    with pytest.raises(SpecqError, match="different vocabularies"):
        calibrate(target, foreign, SMALL, progress=False)
