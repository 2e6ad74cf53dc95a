"""Draft registry: exact precision (the user's first; for a GGUF file, its file type's entry first),
then the nearest shipped precision, never a user's draft at another precision; corrupt or missing
manifests are clear errors."""

import re

import pytest

from specq.errors import SpecqError
from specq.loading.drafts import registry


def _draft(root, name):
    (root / name).mkdir(parents=True)
    (root / name / "config.json").write_text("{}")


def test_exact_then_nearest(tmp_path):
    shipped, user = tmp_path / "shipped", tmp_path / "user"
    for name in ("base", "base-int4", "base-int8"):
        _draft(shipped, name)
    _draft(user, "cal-int4")
    registry.add(shipped, registry.Entry("m", "fp32", "base"))
    registry.add(shipped, registry.Entry("m", "int4-g64-gptq", "base-int4"))
    registry.add(user, registry.Entry("m", "int4-g64-gptq", "cal-int4"))
    # exact: the user's first
    path, entry, exact = registry.select(shipped, user, "m", "int4-g64-gptq")
    assert exact and path == user / "cal-int4"
    # nearest: int4, the shipped one
    path, entry, exact = registry.select(shipped, user, "m", "int3-g64-gptq")
    assert not exact and path == shipped / "base-int4"
    path, entry, exact = registry.select(shipped, user, "m", "bf16")  # nearest step size: fp32
    assert not exact and entry.draft == "base"
    registry.add(shipped, registry.Entry("m", "int8", "base-int8"))
    # int4 (step 1/16) beats int8 (1/256)
    path, entry, exact = registry.select(shipped, user, "m", "int2-g32-rtn")
    assert not exact and entry.draft == "base-int4"
    # fp32 (1/2^32) beats int8 (1/256)
    path, entry, exact = registry.select(shipped, user, "m", "bf16")
    assert not exact and entry.draft == "base"
    assert registry.select(shipped, user, "other-model", "fp32") is None


def test_a_users_draft_never_stands_in_for_another_precision(tmp_path):
    """Registered for int4 by the user, it is used at int4 only: at int3 the nearest shipped entry
    is chosen, and with none shipped, plain decoding."""
    shipped, user = tmp_path / "shipped", tmp_path / "user"
    _draft(shipped, "base")
    _draft(user, "cal-int4")
    registry.add(user, registry.Entry("m", "int4-g64-gptq", "cal-int4"))
    assert registry.select(shipped, user, "m", "int3-g64-gptq") is None
    registry.add(shipped, registry.Entry("m", "fp32", "base"))
    assert registry.select(shipped, user, "m", "int3-g64-gptq")[0] == shipped / "base"


def test_a_feature_draft_wins_unless_the_draft_is_to_be_quantized(tmp_path):
    _draft(tmp_path, "seq")
    (tmp_path / "feat").mkdir()
    (tmp_path / "feat" / "feature_draft.json").write_text("{}")
    registry.add(tmp_path, registry.Entry("m", "fp32", "seq"))
    registry.add(tmp_path, registry.Entry("m", "fp32", "feat"))
    none = tmp_path / "none"
    assert registry.select(tmp_path, none, "m", "fp32")[0] == tmp_path / "feat"  # the later entry
    assert registry.select(tmp_path, none, "m", "int8")[0] == tmp_path / "feat"
    assert registry.select(tmp_path, none, "m", "fp32", quantizable=True)[0] == tmp_path / "seq"


def test_add_replaces_and_skips_missing_dirs(tmp_path):
    registry.add(tmp_path, registry.Entry("m", "int8", "gone"))
    # the draft directory does not exist
    assert registry.select(tmp_path, tmp_path, "m", "int8") is None
    registry.add(tmp_path, registry.Entry("m", "int8", "gone", info={"beta": 0.9}))
    assert len(registry.read(tmp_path)) == 1


def test_corrupt_or_missing_manifest(tmp_path):
    (tmp_path / registry.MANIFEST).write_text('{"drafts": [{"target": "m"')
    with pytest.raises(SpecqError, match="corrupt"):
        registry.read(tmp_path)
    with pytest.raises(SpecqError, match="no draft registry"):
        registry.read(tmp_path / "nowhere", required=True)
    assert registry.read(tmp_path / "nowhere") == []


def test_model_pool_picks_the_draft_per_request_precision(tmp_path, monkeypatch):
    import specq
    from specq.loading.formats.save import save_native

    from conftest import perturbed, tiny_model

    monkeypatch.setenv("SPECQ_CACHE", str(tmp_path / "cache"))
    target = tiny_model(vocab=64, hidden=64, scale=3.0)
    save_native(target, tmp_path / "target")
    drafts = tmp_path / "cache" / "drafts"
    for name, spec in (("for-fp32", "fp32"), ("for-int4", "int4-g32-rtn")):
        save_native(perturbed(target, 0.3, ref=name), drafts / name)
        registry.add(drafts, registry.Entry(str(tmp_path / "target"), spec, name))
    pool = specq.ModelPool(str(tmp_path / "target"))
    # each behind an n-gram lookup (the default)
    assert pool.models("int4-g32-rtn")[1].fallback.source.endswith("for-int4")
    assert pool.models("fp32")[1].fallback.source.endswith("for-fp32")
    quantized = specq.load(f"{tmp_path / 'target'}@int4-g32-rtn")
    plain = specq.generate(quantized, [1, 2, 3], None, max_new_tokens=16)
    out = pool.generate([1, 2, 3], precision="int4-g32-rtn", gamma=3, max_new_tokens=16)
    assert out.token_ids == plain.token_ids and out.draft.endswith("for-int4")
    # none shipped, and the registered drafts are as large as the target: the lookup alone
    _, draft, note = pool.models("int8")
    assert isinstance(draft, specq.NgramDraft) and draft.fallback is None
    assert re.search("no draft registered .* used only at those precisions", note)
    assert pool.generate([1, 2, 3], precision="int8", max_new_tokens=4).draft == draft.ref


def test_an_entry_can_name_the_drafts_own_precision(tmp_path, monkeypatch):
    """`draft_spec` runs the selected draft at that precision: the selected ref carries it."""
    from specq.loading.drafts.select import select_draft

    monkeypatch.setenv("SPECQ_CACHE", str(tmp_path / "cache"))
    drafts = tmp_path / "cache" / "drafts"
    _draft(drafts, "small")
    registry.add(drafts, registry.Entry("m", "int8", "small", draft_spec="int8-head8"))
    registry.add(drafts, registry.Entry("m", "fp32", "small"))
    assert select_draft("m@int8")[0] == f"{drafts / 'small'}@int8-head8"
    assert select_draft("m")[0] == str(drafts / "small")  # no spec: the draft as stored


def test_a_builtin_model_can_be_a_registered_draft(tmp_path, monkeypatch):
    """The Qwen pair: the 1.5B file's default draft is the 0.5B built-in, a name with no folder,
    with a 4-bit body and its head narrowed (`file_spec`)."""
    from specq.loading.drafts.select import known_drafts, select_draft
    from specq.loading.refs import check_ref

    monkeypatch.setenv("SPECQ_CACHE", str(tmp_path))
    assert select_draft("qwen2.5-coder-1.5b")[0] == "qwen2.5-coder-0.5b@gguf-int4-head32k"
    assert select_draft("qwen2.5-coder-1.5b@gguf")[0] == "qwen2.5-coder-0.5b@gguf-int4-head32k"
    check_ref(select_draft("qwen2.5-coder-1.5b")[0])  # a ref that loads
    assert known_drafts("qwen2.5-coder-1.5b") == {"qwen2.5-coder-0.5b"}
    # a built-in file is not re-quantized
    assert select_draft("qwen2.5-coder-1.5b", quantizable=True)[0] is None
    entry = registry.Entry("t", "fp32", "no-such-folder")
    registry.add(tmp_path / "reg", entry)
    assert registry.candidates(tmp_path / "reg", "t") == []  # a folder entry needs its folder
    registry.add(tmp_path / "reg", registry.Entry("t", "fp32", "qwen2.5-coder-0.5b", builtin=True))
    assert ([e.draft for _, e in registry.candidates(tmp_path / "reg", "t")]
            == ["qwen2.5-coder-0.5b"])


def test_a_gguf_file_of_a_builtin_model_gets_its_drafts(tmp_path, monkeypatch):
    """A GGUF file named by its path whose header has a built-in's architecture, shape and tokenizer
    (another quantization of it) gets the drafts registered for that built-in, with a note naming
    it; a file of another shape or tokenizer, or with no built-in file on disk, gets none."""
    from conftest import tiny_model, write_tiny_gguf

    from specq.loading.drafts import select as drafts

    monkeypatch.setenv("SPECQ_CACHE", str(tmp_path / "cache"))
    model = tiny_model(vocab=32, hidden=64)
    files = {name: tmp_path / f"{name}.gguf"
             for name in ("builtin", "requantized", "deeper", "retokenized")}
    write_tiny_gguf(files["builtin"], model)
    write_tiny_gguf(files["requantized"], model, "Q8_0")
    write_tiny_gguf(files["deeper"], tiny_model(vocab=32, hidden=64, layers=3))
    write_tiny_gguf(files["retokenized"], model,
                    extra=lambda w: w.add_string("tokenizer.ggml.pre", "other"))
    registry.add(registry.user_dir(),
                 registry.Entry("tiny-builtin", "gguf", "qwen2.5-coder-0.5b", builtin=True))
    monkeypatch.setattr(drafts, "gguf_files_present", lambda: {"tiny-builtin": files["builtin"]})
    ref, note = drafts.select_draft(str(files["requantized"]))
    assert ref == "qwen2.5-coder-0.5b" and ("registered for tiny-builtin@gguf; "
                                            f"'{files['requantized']}'") in note
    # a user's draft stands in for no other
    assert drafts.select_draft(f"{files['requantized']}@int8")[0] is None
    assert drafts.select_draft(str(files["deeper"]))[0] is None
    assert drafts.select_draft(str(files["retokenized"]))[0] is None
    monkeypatch.setattr(drafts, "gguf_files_present", lambda: {})
    assert drafts.select_draft(str(files["requantized"])) == (
        None, f"no draft registered for {files['requantized']}@gguf: plain decoding")


def test_a_qad_precision_has_its_own_drafts(tmp_path):
    """`-qad` is a precision like any other: a draft registered for it is chosen for it and for
    nothing else; without one, the nearest shipped precision stands in."""
    shipped, user = tmp_path / "shipped", tmp_path / "user"
    for name in ("base", "base-int4"):
        _draft(shipped, name)
    _draft(user, "cal-qad")
    registry.add(shipped, registry.Entry("m", "fp32", "base"))
    registry.add(shipped, registry.Entry("m", "int4-g64-rtn", "base-int4"))
    registry.add(user, registry.Entry("m", "int4-g64-rtn-qad", "cal-qad"))
    assert registry.select(shipped, user, "m", "int4-g64-rtn-qad")[::2] == (user / "cal-qad", True)
    assert registry.select(shipped, user, "m", "int4-g64-rtn")[::2] == (shipped / "base-int4", True)
    assert (registry.select(shipped, user, "m", "int3-g64-rtn-qad")[::2]
            == (shipped / "base-int4", False))


def test_a_gguf_files_type_picks_its_own_draft(tmp_path):
    """An entry for Q2_K files is chosen for a Q2_K file before one for any file, and for no other
    type; as a stand-in, its bits are the type's (2), so it is the nearest to an int2 target."""
    shipped, user = tmp_path / "shipped", tmp_path / "user"
    for name in ("any-file", "cal-q2_k", "base"):
        _draft(shipped, name)
    registry.add(shipped, registry.Entry("m", "gguf", "cal-q2_k", file_type="Q2_K"))
    registry.add(shipped, registry.Entry("m", "gguf", "any-file"))
    registry.add(shipped, registry.Entry("m", "fp32", "base"))
    assert len(registry.read(shipped)) == 3  # one entry per file type, not one replacing the other
    assert registry.select(shipped, user, "m", "gguf", file_type="Q2_K")[1].draft == "cal-q2_k"
    assert registry.select(shipped, user, "m", "gguf", file_type="Q4_K_M")[1].draft == "any-file"
    assert registry.select(shipped, user, "m", "gguf")[1].draft == "any-file"  # type unknown
    path, entry, exact = registry.select(shipped, user, "m", "int2-g64-rtn")
    assert not exact and entry.draft == "cal-q2_k"
    assert registry.precision_bits("gguf", "Q3_K_M") == 3
    assert registry.precision_bits("gguf", "IQ2_XXS") == 2 and registry.precision_bits("gguf") == 4
    assert registry.precision_bits("gguf", "BF16") == 16
    registry.remove(shipped, [registry.Entry("m", "gguf", "cal-q2_k", file_type="Q2_K")])
    assert [e.draft for e in registry.read(shipped)] == ["any-file", "base"]


def test_a_users_q2_k_file_gets_the_draft_registered_for_q2_k_files(tmp_path, monkeypatch):
    """A draft registered for a built-in's Q2_K files: a Q2_K file of that model (its twin by
    header) gets that draft, with a note naming the type; the built-in's own file (another type)
    keeps the draft registered for any file."""
    import gguf
    from conftest import tiny_model, write_tiny_gguf

    from specq.loading.drafts import select as drafts

    monkeypatch.setenv("SPECQ_CACHE", str(tmp_path / "cache"))
    model = tiny_model(vocab=32, hidden=64)
    builtin, mine = tmp_path / "builtin.gguf", tmp_path / "mine-q2_k.gguf"

    def typed(t):
        return lambda w: w.add_file_type(int(t))

    write_tiny_gguf(builtin, model, extra=typed(gguf.LlamaFileType.ALL_F32))
    write_tiny_gguf(mine, model, "Q8_0", extra=typed(gguf.LlamaFileType.MOSTLY_Q2_K))
    monkeypatch.setattr(drafts, "gguf_files_present", lambda: {"tiny-builtin": builtin})
    assert drafts.file_type(str(mine)) == "Q2_K" and drafts.file_type("tiny-builtin") == "F32"
    assert drafts.file_type(str(tmp_path / "absent.gguf")) == ""
    for draft in ("any-file", "cal-q2_k"):
        _draft(tmp_path, draft)
    registry.add(registry.user_dir(), registry.Entry("tiny-builtin", "gguf",
                                                     str(tmp_path / "any-file")))
    registry.register("tiny-builtin", "gguf", tmp_path / "cal-q2_k", file_type="Q2_K")
    ref, note = drafts.select_draft(str(mine))
    assert ref == str(tmp_path / "cal-q2_k") and "tiny-builtin@gguf, Q2_K files" in note
    assert drafts.select_draft("tiny-builtin@gguf")[0] == str(tmp_path / "any-file")
