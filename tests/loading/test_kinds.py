"""The draft kinds table (`loading/kinds.py`): each kind is recognized from its ref or its folder,
loads through `specq.load` (with its target where it needs one), and drafts losslessly through
`specq.generate`; nothing outside a kind's own code asks what a draft is."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import specq
from specq.drafters.ngram import NgramDraft
from specq.errors import SpecqError
from specq.loading import kinds
from specq.core.types import Draft, Model
from specq.loading.formats.save import save_native
from specq.model import feature_draft
from specq.model.feature_draft import new_feature_draft

from conftest import assert_speculative_is_plain, perturbed, tiny_model

PACKAGE = Path(specq.__file__).parent


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A target, a sequence draft and a feature draft for it, saved as folders."""
    root = tmp_path_factory.mktemp("kinds")
    target = tiny_model(scale=3.0, seed=4)
    save_native(target, root / "target")
    save_native(perturbed(target, 0.3), root / "draft")
    feature_draft.save(new_feature_draft(target.net, torch.arange(32), seed=1), root / "feature",
                       target.tokenizer, target.eos_ids)
    (root / "neither").mkdir()
    return root


def test_each_kind_is_recognized_from_its_ref_or_folder(folders):
    cases = {"ngram": "ngram", "ngram:n=2-3:k=4": "ngram", f"ngram+{folders / 'draft'}": "ngram",
             "lookahead": "lookahead", "lookahead:w=2:g=1": "lookahead",
             "self@int8-head8": "self", "self@int4-g64-gptq": "self",
             "self@skip": "skip", "self@gguf-int4@skip=3-5": "skip", "smollm2-135m@skip": "skip",
             str(folders / "feature"): "feature", f"{folders / 'feature'}@int8-head8": "feature",
             "smollm2-135m-feature-draft": "feature",  # shipped: its folder is in the package
             str(folders / "draft"): "sequence", "smollm2-135m-draft": "sequence",
             "model.gguf": "sequence", "org/name": "sequence"}
    assert {ref: kinds.recognize(ref).name for ref in cases} == cases
    # every kind, the catch-all last
    assert list(kinds.KINDS) == ["ngram", "lookahead", "skip", "self", "feature", "sequence"]


@pytest.mark.parametrize("ref,needle",
                         [("no-such-model", "unknown model"), ("", "empty model reference"),
                          (42, "a model reference is a string"), ("self@", "ends in '@'"),
                          ("ngram:q=1", "unknown option")])
def test_an_unknown_ref_is_one_clear_error(ref, needle):
    with pytest.raises(SpecqError, match=re.escape(needle)) as e:
        specq.load(ref)
    assert "\n" not in str(e.value)


def test_a_folder_of_no_kind_is_one_clear_error(folders):
    with pytest.raises(SpecqError, match="config.json") as e:
        specq.load(str(folders / "neither"))
    assert "\n" not in str(e.value)


def test_a_loaded_thing_of_no_kind_is_one_clear_error():
    with pytest.raises(SpecqError, match="a draft is a model or draft from specq.load"):
        kinds.kind_of(object())
    target = tiny_model()
    with pytest.raises(SpecqError, match="the draft must be a model from specq.load"):
        specq.generate(target, [1, 2], draft=[target.net])


def test_self_loads_from_python_with_its_target_and_is_lossless(folders):
    target = specq.load(str(folders / "target"))
    with pytest.raises(SpecqError, match="load it with its target"):
        specq.load("self@int8-head8")
    draft = specq.load("self@int8-head8", target=target)
    assert isinstance(draft, Draft) and draft.kind is kinds.KINDS["self"]
    assert draft.ref == f"{folders / 'target'}@int8-head8" and draft.precision == "int8-head8"
    assert specq.load("self@int8-head8", target=target.ref).ref == draft.ref  # or the target's ref
    assert_speculative_is_plain(target, draft)  # accepted and rejected drafts
    with pytest.raises(SpecqError,
                       match="is a self draft: it drafts for a target and cannot be one"):
        specq.generate(draft, [1, 2], None)


def test_a_feature_draft_loads_as_a_draft_never_a_target(folders):
    target = specq.load(str(folders / "target"))
    draft = specq.load(str(folders / "feature"))
    assert (isinstance(draft, Draft) and not isinstance(draft, Model)
            and draft.kind is kinds.KINDS["feature"])
    assert_speculative_is_plain(target, draft)
    with pytest.raises(SpecqError,
                       match="is a feature draft: it drafts for a target and cannot be one"):
        specq.generate(draft, [1, 2], None)
    kinds.save(draft, folders / "feature-again", {"base": draft.ref})
    again = specq.load(str(folders / "feature-again"))
    assert again.kind is draft.kind and torch.equal(again.net.vocab_ids, draft.net.vocab_ids)


def test_sequence_ngram_and_lookahead_drafts_load_through_specq_load(folders):
    target = specq.load(str(folders / "target"))
    sequence = specq.load(str(folders / "draft"))
    # it can be a target too
    assert type(sequence) is Model and kinds.kind_of(sequence) is kinds.KINDS["sequence"]
    lookup = specq.load("ngram")
    assert isinstance(lookup, NgramDraft) and lookup.fallback is None
    with_model = specq.load(f"ngram:k=3+{folders / 'draft'}", target=target)
    assert type(with_model.fallback) is Model and with_model.k == 3
    with_self = specq.load("ngram+self@int8-head8", target=target)
    assert with_self.fallback.kind is kinds.KINDS["self"]
    lookahead = specq.load("lookahead:w=3")
    assert isinstance(lookahead, specq.LookaheadDraft) and lookahead.w == 3
    assert kinds.kind_of(lookahead) is kinds.KINDS["lookahead"]
    prompt = [5, 6, 7, 5, 6, 7, 5, 6]
    plain = specq.generate(target, prompt, None, max_new_tokens=24).token_ids
    for draft in (sequence, lookup, with_model, with_self, lookahead):
        assert specq.generate(target, prompt, draft, max_new_tokens=24,
                              draft_confidence=0.0).token_ids == plain


# the only modules that may name the feature draft's class or module: its own code
# and the kinds tables
FEATURE_CODE = {"model/feature_draft.py", "drafters/feature.py", "loading/kinds.py",
                "loading/drafts/folders.py", "training/students.py"}
ASKS = re.compile(r"\bFeatureDraft\b|\bis_feature_draft\b|\bfeature_draft\.(?!json\b)\w+|import "
                  r"feature_draft\b|\bmodel\.feature_draft\b")


def asking(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if ASKS.search(line)]


def test_no_module_outside_the_kinds_code_asks_for_a_feature_draft():
    found = {str(f.relative_to(PACKAGE)): asking(f.read_text()) for f in PACKAGE.rglob("*.py")
             if str(f.relative_to(PACKAGE)) not in FEATURE_CODE}
    assert {f: lines for f, lines in found.items() if lines} == {}


def test_the_check_finds_a_module_that_asks():
    assert asking("from ..model.feature_draft import FeatureDraft\nx = 1") != []
    assert asking("if isinstance(draft.net, FeatureDraft):") != []
    assert asking("feature_draft.is_feature_draft(path)") != []
    assert asking('names = ("distill.json", "feature_draft.json")  # a file name') == []
